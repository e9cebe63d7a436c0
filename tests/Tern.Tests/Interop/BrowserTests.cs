using System.Text.Json;
using Tern.Tests.Infrastructure;

namespace Tern.Tests.Interop;

/// <summary>
/// Chromium, the client most of Tern's users run, against Tern: its TLS stack (BoringSSL: GREASE
/// values, and an X25519MLKEM768 key share beside the X25519 one, which OpenSSL 3.0 passes over;
/// seen with <c>openssl s_server -trace</c>), its HTTP/2 client (its window sizes, priorities and stream
/// resets) or, with HTTP/2 off, its pool of HTTP/1.1 connections, and its WebSockets, which over
/// HTTP/2 are extended CONNECT streams (RFC 8441) that YARP turns into HTTP/1.1 upgrades.
/// </summary>
public abstract class BrowserTests(string engine) : IAsyncLifetime
{
    /// <summary>
    /// Run in the page: parallel downloads and uploads of every size, WebSockets, a streamed upload
    /// (HTTP/2 only: browsers stream request bodies over nothing else), then downloads cancelled
    /// after their first piece, and one more download after them. Each byte is checked against
    /// <see cref="TestUpstream.Pattern"/>; the value says which protocols the requests went over.
    /// </summary>
    private const string Script = """
        (async () => {
          performance.setResourceTimingBufferSize(100000);
          const pattern = n => { const b = new Uint8Array(n); for (let i = 0; i < n; i++) b[i] = (i * 31 + (i >> 13) + 7) & 255; return b; };
          const equal = (a, b) => { if (a.length !== b.length) return false; for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false; return true; };
          const expected = {};
          for (const n of [0, 1024, 65536, 1048576, 16777216]) expected[n] = pattern(n);
          const protocols = new Set();
          const check = async (what, response, want) => {
            const got = new Uint8Array(await response.arrayBuffer());
            if (response.status !== 200 || !equal(got, want)) throw new Error(`${what}: status ${response.status}, ${got.length} bytes, expected ${want.length}`);
            protocols.add(performance.getEntriesByName(response.url).at(-1).nextHopProtocol);
          };
          const get = async (n, i) => check(`GET /bytes/${n}`, await fetch(`/bytes/${n}?i=${i}`, { cache: 'no-store' }), expected[n]);
          const post = async (n, i) => check(`POST /echo (${n} bytes)`, await fetch(`/echo?i=${i}`, { method: 'POST', body: expected[n] }), expected[n]);
          const socket = i => new Promise((resolve, reject) => {
            const sizes = [1024, 65536, 1048576];
            let echoed = 0;
            const ws = new WebSocket(`wss://${location.host}/ws?i=${i}`);
            ws.binaryType = 'arraybuffer';
            ws.onopen = () => ws.send(expected[sizes[0]]);
            ws.onmessage = e => {
              const got = new Uint8Array(e.data);
              if (!equal(got, expected[sizes[echoed]])) { reject(new Error(`WebSocket ${i}: message ${echoed} came back as ${got.length} bytes`)); ws.close(); return; }
              if (++echoed < sizes.length) ws.send(expected[sizes[echoed]]); else ws.close(1000, 'done');
            };
            ws.onerror = () => reject(new Error(`WebSocket ${i} failed`));
            ws.onclose = e => echoed === sizes.length ? resolve(e.code) : reject(new Error(`WebSocket ${i} closed after ${echoed} messages: ${e.code} ${e.reason}`));
          });
          const jobs = [];
          for (let i = 0; i < 100; i++) jobs.push(get(1024, i));
          for (let i = 0; i < 30; i++) jobs.push(get(65536, i));
          for (let i = 0; i < 8; i++) jobs.push(get(1048576, i));
          jobs.push(get(16777216, 0));
          for (const n of [0, 1024, 1048576, 16777216]) jobs.push(post(n, n));
          for (let i = 0; i < 4; i++) jobs.push(socket(i));
          await Promise.all(jobs);
          let streamed = 0;
          if (protocols.has('h2')) {
            const body = new ReadableStream({ start(c) { for (let k = 0; k < 16; k++) c.enqueue(expected[65536]); c.close(); } });
            const response = await fetch('/echo?streamed', { method: 'POST', body, duplex: 'half' });
            const got = new Uint8Array(await response.arrayBuffer());
            for (let k = 0; k < 16; k++) if (!equal(got.subarray(k * 65536, (k + 1) * 65536), expected[65536])) throw new Error(`streamed upload: piece ${k} came back wrong (${got.length} bytes in all)`);
            streamed = got.length;
          }
          let cancelled = 0;
          await Promise.all([...Array(10).keys()].map(async i => {
            const control = new AbortController();
            const response = await fetch(`/bytes/16777216?cancel=${i}`, { signal: control.signal, cache: 'no-store' });
            const reader = response.body.getReader();
            await reader.read();
            control.abort();
            try { while (!(await reader.read()).done) {} } catch (e) { if (e.name !== 'AbortError') throw e; cancelled++; }
          }));
          await get(1048576, 'after');
          return { protocols: [...protocols].sort().join(','), streamed, cancelled };
        })()
        """;

    private TestUpstream _upstream = null!;
    private TernInstance _tern = null!;

    public async Task InitializeAsync()
    {
        _upstream = await TestUpstream.StartAsync();
        _tern = await TernInstance.StartAsync(TernConfig.To(engine, _upstream));
    }

    public async Task DisposeAsync()
    {
        await _tern.DisposeAsync();
        await _upstream.DisposeAsync();
    }

    [Theory]
    [InlineData(true)]
    [InlineData(false)]
    public async Task Chromium_DownloadsUploadsWebSocketsAndCancels(bool http2)
    {
        using var requests = new MeterReader(_tern, "Microsoft.AspNetCore.Hosting");
        await using var browser = await Browser.StartAsync(http2);

        var result = await browser.RunAsync($"https://localhost:{_tern.Config.HttpsPort}/name", Script, TimeSpan.FromSeconds(120));

        Assert.Equal(http2 ? "h2" : "http/1.1", result.GetProperty("protocols").GetString());
        Assert.Equal(http2 ? 16 * 65536 : 0, result.GetProperty("streamed").GetInt32());
        Assert.Equal(10, result.GetProperty("cancelled").GetInt32());

        // The four WebSockets reached Tern as what each protocol makes of them: extended CONNECT
        // streams over HTTP/2, upgrades (101) over HTTP/1.1. Each is counted once it has closed.
        string[] webSocket = http2 ? ["http.request.method=CONNECT", "http.response.status_code=200"] : ["http.request.method=GET", "http.response.status_code=101"];
        var deadline = DateTime.UtcNow + TimeSpan.FromSeconds(10);
        while (requests.Total("http.server.request.duration", webSocket) < 4 && DateTime.UtcNow < deadline)
        {
            await Task.Delay(50);
        }

        Assert.Equal(4, requests.Total("http.server.request.duration", webSocket));

        // Cancelled downloads are the client's doing, logged at Information with the status the
        // browser got, 200, not as a 499 it never saw.
        await _tern.Logs.WaitForAsync("Information: Tern.Proxy.Forwarding: GET /bytes/16777216: the client went away during its 200 response");
        Assert.DoesNotContain(_tern.Logs.Lines, l => l.Contains("returned 499", StringComparison.Ordinal));
        // (YARP's forwarder logs each failure too; the shipped configuration keeps it at Error.)
        var alarms = _tern.Logs.Lines.Where(l => !l.StartsWith("Information:", StringComparison.Ordinal) && !l.StartsWith("Debug:", StringComparison.Ordinal)
            && !l.StartsWith("Warning: Yarp.ReverseProxy.Forwarder.HttpForwarder:", StringComparison.Ordinal)).ToList();
        Assert.True(alarms.Count == 0, string.Join("\n", _tern.Logs.Lines));
    }
}

public sealed class OpenSslBrowserTests() : BrowserTests(Proxy.Tls.TlsEngines.OpenSsl);

public sealed class SslStreamBrowserTests() : BrowserTests(Proxy.Tls.TlsEngines.SslStream);
