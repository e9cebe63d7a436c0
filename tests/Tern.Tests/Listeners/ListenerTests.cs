using System.Net;
using System.Net.Sockets;
using System.Text.Json.Nodes;
using Microsoft.AspNetCore.Connections;
using Microsoft.AspNetCore.Connections.Features;
using Microsoft.Extensions.DependencyInjection;
using Tern.Proxy.Listeners;
using Tern.Tests.Infrastructure;

namespace Tern.Tests.Listeners;

public abstract class ListenerTests(string engine) : IAsyncLifetime
{
    private TestUpstream _upstream = null!;
    private TernInstance _tern = null!;

    public async Task InitializeAsync()
    {
        _upstream = await TestUpstream.StartAsync();
        var config = TernConfig.To(engine, _upstream);
        config.Route("plain", "app", "/plain/{**rest}", new JsonObject
        {
            ["Metadata"] = new JsonObject { ["Tern.AllowPlainHttp"] = "true" },
            ["Transforms"] = new JsonArray(new JsonObject { ["PathRemovePrefix"] = "/plain" }),
        });
        _tern = await TernInstance.StartAsync(config);
    }

    public async Task DisposeAsync()
    {
        await _tern.DisposeAsync();
        await _upstream.DisposeAsync();
    }

    [Fact]
    public async Task Http_RouteWithoutPlainHttp_RedirectsToHttpsKeepingPathAndQuery()
    {
        using var client = _tern.CreatePlainClient(_tern.Config.HttpPort, host: "shop.test");

        using var response = await client.PostAsync(new Uri("/cart/items?id=7", UriKind.Relative), new StringContent("x"));

        Assert.Equal(HttpStatusCode.PermanentRedirect, response.StatusCode);
        Assert.Equal(new Uri($"https://shop.test:{_tern.Config.HttpsPort}/cart/items?id=7"), response.Headers.Location);
        Assert.Equal(0, _upstream.Requests);
    }

    [Fact]
    public async Task Http_RouteAllowsPlainHttp_IsForwarded()
    {
        using var client = _tern.CreatePlainClient(_tern.Config.HttpPort);

        using var response = await client.GetAsync(new Uri("/plain/name", UriKind.Relative));

        Assert.Equal(HttpStatusCode.OK, response.StatusCode);
        Assert.Equal("up", await response.Content.ReadAsStringAsync());
    }

    /// <summary>
    /// A body refused before it was read (over Kestrel's 30 MB limit) is answered with a 413, and
    /// Tern ends the connection while the client is still sending. A client that reads only once it
    /// has sent its body, as many do, must still get that answer: Tern reads and drops what still
    /// comes until the client closes (RFC 9112, 9.6; nginx's lingering close). Closing over unread
    /// bytes made the kernel reset the connection, and the client's next write failed ("broken
    /// pipe") before it read the 413 (this test, on every listener and engine, before lingering).
    /// </summary>
    [Theory]
    [InlineData("https")]
    [InlineData("http")]
    public async Task UploadRefusedWhileTheClientStillSends_TheClientGetsTheAnswer(string scheme)
    {
        var https = scheme == "https";
        await using var client = await RawHttp.ConnectAsync(https ? _tern.Config.HttpsPort : _tern.Config.HttpPort, https);
        await client.WriteAsync("POST /plain/echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: 40000000\r\n\r\n");
        var chunk = new byte[256 * 1024];
        for (var sent = 0; sent < 40_000_000; sent += chunk.Length)
        {
            await client.WriteAsync(chunk.AsMemory(0, Math.Min(chunk.Length, 40_000_000 - sent)));
        }

        var answer = await client.ReadUntilAsync("\n");
        Assert.StartsWith("HTTP/1.1 413", answer, StringComparison.Ordinal);
    }

    /// <summary>
    /// The lingering close is bounded: a client that neither sends nor closes after Tern's answer
    /// is closed after 5 s of silence on the OpenSSL engine's HTTPS (which has told it with
    /// close_notify that Tern is done); elsewhere, after 1 s without a byte or 5 s after its last
    /// (Kestrel's stacks cannot tell it). A stopping server does not wait for it.
    /// </summary>
    [Theory]
    [InlineData("https")]
    [InlineData("http")]
    public async Task LingeringClose_SilentClientIsClosedAfterFiveSeconds_AndStoppingCutsItShort(string scheme)
    {
        var https = scheme == "https";
        const string refused = "POST /plain/echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: 40000000\r\n\r\n";
        await using (var client = await RawHttp.ConnectAsync(https ? _tern.Config.HttpsPort : _tern.Config.HttpPort, https))
        {
            await client.WriteAsync(refused);
            await client.WriteAsync(new byte[64 * 1024]);
            Assert.StartsWith("HTTP/1.1 413", await client.ReadUntilAsync("\n"), StringComparison.Ordinal);
            var silent = System.Diagnostics.Stopwatch.StartNew();
            await SocketReads.UntilClosedAsync(client.Socket, TimeSpan.FromSeconds(15));
            var told = https && engine == Proxy.Tls.TlsEngines.OpenSsl;
            Assert.InRange(silent.Elapsed, TimeSpan.FromSeconds(told ? 4 : 0.8), TimeSpan.FromSeconds(10));
        }

        var config = TernConfig.To(engine, _upstream);
        config.Route("plain", "app", "/plain/{**rest}", new JsonObject
        {
            ["Metadata"] = new JsonObject { ["Tern.AllowPlainHttp"] = "true" },
            ["Transforms"] = new JsonArray(new JsonObject { ["PathRemovePrefix"] = "/plain" }),
        });
        var stopping = await TernInstance.StartAsync(config);
        await using var lingering = await RawHttp.ConnectAsync(https ? stopping.Config.HttpsPort : stopping.Config.HttpPort, https);
        await lingering.WriteAsync(refused);
        await lingering.WriteAsync(new byte[64 * 1024]);
        Assert.StartsWith("HTTP/1.1 413", await lingering.ReadUntilAsync("\n"), StringComparison.Ordinal);
        var stop = System.Diagnostics.Stopwatch.StartNew();
        await stopping.DisposeAsync();
        Assert.InRange(stop.Elapsed, TimeSpan.Zero, TimeSpan.FromSeconds(3));
    }

    /// <summary>
    /// A client that asks to close after a request without a body (HTTP/1.0 here, whose answer
    /// without a length ends with the connection) has nothing more to send: Tern closes as soon as
    /// the answer is out. Before, Kestrel's stacks (the plain listener, the SslStream engine)
    /// lingered a second (FirstQuiet) for bytes that could not come, and such a client got the end
    /// of its answer a second late. (The OpenSSL engine's close_notify told the client at once.)
    /// </summary>
    [Theory]
    [InlineData("https", "HTTP/1.0\r\nHost: localhost")]
    [InlineData("http", "HTTP/1.0\r\nHost: localhost")]
    [InlineData("http", "HTTP/1.1\r\nHost: localhost\r\nConnection: close")] // its answer is chunked, but the end comes as late
    public async Task ClientThatAskedToClose_TheConnectionEndsWithTheAnswer(string scheme, string request)
    {
        var https = scheme == "https";
        await using var client = await RawHttp.ConnectAsync(https ? _tern.Config.HttpsPort : _tern.Config.HttpPort, https);
        await client.WriteAsync($"GET /plain/name {request}\r\n\r\n");

        // The answer's last byte, then the connection's end, which ends this answer (no length).
        var answer = new System.Text.StringBuilder();
        var buffer = new byte[4096];
        var answered = new System.Diagnostics.Stopwatch();
        int read;
        while ((read = await client.Stream.ReadAsync(buffer)) > 0)
        {
            answer.Append(System.Text.Encoding.Latin1.GetString(buffer, 0, read));
            answered.Restart();
        }

        answered.Stop();
        Assert.StartsWith("HTTP/1.1 200", answer.ToString(), StringComparison.Ordinal);
        Assert.DoesNotContain("Content-Length", answer.ToString(), StringComparison.OrdinalIgnoreCase);
        Assert.Contains("up", answer.ToString()[answer.ToString().IndexOf("\r\n\r\n", StringComparison.Ordinal)..], StringComparison.Ordinal);
        Assert.InRange(answered.Elapsed, TimeSpan.Zero, TimeSpan.FromSeconds(0.9));
    }

    /// <summary>
    /// Only a request Kestrel answers with Connection: close marks its connection as done: one whose
    /// header Kestrel reads otherwise ("x,\tclose", close beside a tab) leaves it open, and a later
    /// upload refused while its client waits to send (Expect: 100-continue, then its body) still
    /// gets the lingering close and its 413. Read by Tern alone, that header had marked the
    /// connection, and the upload's body met a reset (broken pipe) instead of the answer.
    /// </summary>
    [Theory]
    [InlineData("https")]
    [InlineData("http")]
    public async Task ConnectionHeaderKestrelReadsAsKeepAlive_MarksNothing_ALaterRefusedUploadGetsItsAnswer(string scheme)
    {
        var https = scheme == "https";
        await using var client = await RawHttp.ConnectAsync(https ? _tern.Config.HttpsPort : _tern.Config.HttpPort, https);
        await client.WriteAsync("GET /plain/name HTTP/1.1\r\nHost: localhost\r\nConnection: x,\tclose\r\n\r\n");
        Assert.DoesNotContain("Connection: close", await client.ReadUntilAsync("0\r\n\r\n"), StringComparison.OrdinalIgnoreCase);

        await client.WriteAsync("POST /plain/echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: 40000000\r\nExpect: 100-continue\r\n\r\n");
        await Task.Delay(200); // Tern has answered 413 and closes meanwhile
        var chunk = new byte[256 * 1024];
        for (var sent = 0; sent < 4_000_000; sent += chunk.Length)
        {
            await client.WriteAsync(chunk);
        }

        Assert.StartsWith("HTTP/1.1 413", await client.ReadUntilAsync("\n"), StringComparison.Ordinal);
    }

    [Fact]
    public async Task Http_RedirectHttpsPort443_LeavesPortOut()
    {
        var config = TernConfig.To(engine, _upstream);
        config.Tern["Http"]!["RedirectHttpsPort"] = 443;
        await using var tern = await TernInstance.StartAsync(config);
        using var client = tern.CreatePlainClient(config.HttpPort, host: "shop.test");

        using var response = await client.GetAsync(new Uri("/x", UriKind.Relative));

        Assert.Equal(new Uri("https://shop.test/x"), response.Headers.Location);
    }

    [Theory]
    [InlineData(true)]
    [InlineData(false)]
    public async Task Demo_EnabledSetting_TurnsTheEchoListenerOnAndOff(bool enabled)
    {
        var demoPort = FreePort.Next();
        var config = TernConfig.To(engine, _upstream);
        config.Tern["Demo"] = new JsonObject { ["Enabled"] = enabled, ["Port"] = demoPort };
        await using var tern = await TernInstance.StartAsync(config);
        using var client = tern.CreatePlainClient(demoPort, host: "127.0.0.1");

        if (enabled)
        {
            Assert.Contains("\"server\": \"tern-demo\"", await client.GetStringAsync(new Uri("/x", UriKind.Relative)), StringComparison.Ordinal);
        }
        else
        {
            var error = await Assert.ThrowsAsync<HttpRequestException>(() => client.GetAsync(new Uri("/x", UriKind.Relative)));
            Assert.Equal(System.Net.Sockets.SocketError.ConnectionRefused, (error.InnerException as System.Net.Sockets.SocketException)?.SocketErrorCode);
        }
    }

    /// <summary>A body the demo's Kestrel refuses (over 30 MB) is answered with its status, not logged as an application error.</summary>
    [Fact]
    public async Task Demo_BodyOverKestrelsLimit_IsAnswered413_NotLoggedAsAnError()
    {
        var demoPort = FreePort.Next();
        var config = TernConfig.To(engine, _upstream);
        config.Tern["Demo"] = new JsonObject { ["Enabled"] = true, ["Port"] = demoPort };
        await using var tern = await TernInstance.StartAsync(config);
        await using var client = await RawHttp.ConnectAsync(demoPort, tls: false);
        await client.WriteAsync("POST /x HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 40000000\r\n\r\n");
        await client.WriteAsync(new byte[64 * 1024]);

        Assert.StartsWith("HTTP/1.1 413", await client.ReadUntilAsync("\n"), StringComparison.Ordinal);
        await Task.Delay(300);
        Assert.DoesNotContain(tern.Logs.Lines, l => l.StartsWith("Error:", StringComparison.Ordinal) || l.StartsWith("Critical:", StringComparison.Ordinal));
    }

    /// <summary>
    /// Kestrel:Limits, under ASP.NET Core's names, reach every listener: nginx's
    /// client_max_body_size and keepalive_timeout. A route's own MaxRequestBodySize (YARP's) wins.
    /// </summary>
    [Fact]
    public async Task KestrelLimits_BodySizeAndKeepAlive_Apply_AndARouteMayRaiseTheBodyLimit()
    {
        var config = TernConfig.To(engine, _upstream);
        config.Route("big", "app", "/big/{**rest}", new JsonObject
        {
            ["MaxRequestBodySize"] = 100_000,
            ["Transforms"] = new JsonArray(new JsonObject { ["PathRemovePrefix"] = "/big" }),
        });
        config.Kestrel = new JsonObject { ["Limits"] = new JsonObject { ["MaxRequestBodySize"] = 1000, ["KeepAliveTimeout"] = "00:00:02" } };
        await using var tern = await TernInstance.StartAsync(config);
        using var client = tern.CreateClient();

        using var over = await client.PostAsync(new Uri("/echo", UriKind.Relative), new ByteArrayContent(new byte[2000]));
        using var under = await client.PostAsync(new Uri("/echo", UriKind.Relative), new ByteArrayContent(new byte[1000]));
        using var raised = await client.PostAsync(new Uri("/big/echo", UriKind.Relative), new ByteArrayContent(new byte[2000]));

        Assert.Equal(HttpStatusCode.RequestEntityTooLarge, over.StatusCode);
        Assert.Equal(HttpStatusCode.OK, under.StatusCode);
        Assert.Equal(HttpStatusCode.OK, raised.StatusCode);

        // An idle keep-alive connection is closed after 2 s (Kestrel checks once a second), not
        // Kestrel's default 130 s.
        await using var idle = await RawHttp.ConnectAsync(config.HttpsPort);
        await idle.WriteAsync("GET /name HTTP/1.1\r\nHost: localhost\r\n\r\n");
        Assert.StartsWith("HTTP/1.1 200", await idle.ReadUntilAsync("\r\n0\r\n\r\n"), StringComparison.Ordinal);
        var since = System.Diagnostics.Stopwatch.StartNew();
        using var limit = new CancellationTokenSource(TimeSpan.FromSeconds(10));
        Assert.Equal("", await idle.ReadUntilAsync("never sent", limit.Token));
        Assert.InRange(since.Elapsed, TimeSpan.FromSeconds(1.5), TimeSpan.FromSeconds(6));
    }

    [Fact]
    public async Task KestrelLimits_ChangedOnReload_AreLoggedAsNeedingARestart()
    {
        var config = TernConfig.To(engine, _upstream);
        config.Kestrel = new JsonObject { ["Limits"] = new JsonObject { ["MaxRequestBodySize"] = 1000, ["KeepAliveTimeout"] = "00:01:15" } };
        await using var tern = await TernInstance.StartAsync(config);

        // One limit removed (Kestrel's default comes back at a restart), one written differently
        // but the same, and a Kestrel key Tern does not read.
        config.Kestrel = new JsonObject
        {
            ["Limits"] = new JsonObject { ["keepalivetimeout"] = "00:01:15.000" },
            ["Endpoints"] = new JsonObject { ["Https"] = new JsonObject { ["Url"] = "https://*:443" } },
        };
        await tern.RewriteConfigAsync(config.ToJson());

        await tern.Logs.WaitForAsync("Kestrel:Limits:MaxRequestBodySize changed to 30000000; it is applied at start, restart Tern to apply it");
        await tern.Logs.WaitForAsync("Kestrel:Endpoints:Https:Url is ignored: of the Kestrel section Tern reads only Kestrel:Limits");
        await tern.Logs.WaitForAsync("Configuration reloaded");
        Assert.DoesNotContain(tern.Logs.Lines, l => l.Contains("KeepAliveTimeout changed", StringComparison.OrdinalIgnoreCase));

        // JSON null: no limit.
        config.Kestrel = new JsonObject { ["Limits"] = new JsonObject { ["MaxRequestBodySize"] = null, ["KeepAliveTimeout"] = "00:01:15" } };
        await tern.RewriteConfigAsync(config.ToJson());
        await tern.Logs.WaitForAsync("Kestrel:Limits:MaxRequestBodySize changed to none; it is applied at start");
    }

    [Fact]
    public async Task Reload_ChangingHttpPort_KeepsRedirectingOnTheBoundPort()
    {
        var config = TernConfig.To(engine, _upstream);
        await using var tern = await TernInstance.StartAsync(config);
        var otherPort = FreePort.Next();
        config.Tern["Http"]!["Port"] = otherPort;
        await tern.RewriteConfigAsync(config.ToJson());
        await tern.Logs.WaitForAsync($"Tern:Http:Port changed to {otherPort}");

        using var plain = tern.CreatePlainClient(config.HttpPort);
        using var secure = tern.CreateClient();

        Assert.Equal(HttpStatusCode.PermanentRedirect, (await plain.GetAsync(new Uri("/name", UriKind.Relative))).StatusCode);
        Assert.Equal("up", await secure.GetStringAsync(new Uri("/name", UriKind.Relative)));
    }

    [Theory]
    [InlineData("/healthz", HttpStatusCode.OK, "ok\n")]
    [InlineData("/readyz", HttpStatusCode.OK, "ready\n")]
    [InlineData("/metricz", HttpStatusCode.NotFound, "not found: the management port serves /healthz, /readyz and /metrics\n")]
    public async Task Management_Endpoints_AnswerOnManagementPort(string path, HttpStatusCode status, string body)
    {
        using var client = _tern.CreatePlainClient(_tern.Config.ManagementPort);

        using var response = await client.GetAsync(new Uri(path, UriKind.Relative));

        Assert.Equal(status, response.StatusCode);
        Assert.Equal(body, await response.Content.ReadAsStringAsync());
        // Sent with its length, not chunked: one write for a probe's answer.
        Assert.Equal(body.Length, response.Content.Headers.ContentLength);
        Assert.NotEqual(true, response.Headers.TransferEncodingChunked);
    }

    [Theory]
    [InlineData("POST", "/metrics")]
    [InlineData("DELETE", "/healthz")]
    [InlineData("TRACE", "/readyz")]
    public async Task Management_Endpoints_AnswerGetAndHeadOnly(string method, string path)
    {
        using var client = _tern.CreatePlainClient(_tern.Config.ManagementPort);

        using var response = await client.SendAsync(new HttpRequestMessage(new HttpMethod(method), new Uri(path, UriKind.Relative)));
        using var head = await client.SendAsync(new HttpRequestMessage(HttpMethod.Head, new Uri(path, UriKind.Relative)));

        Assert.Equal(HttpStatusCode.MethodNotAllowed, response.StatusCode);
        Assert.Equal("GET, HEAD", string.Join(", ", response.Content.Headers.Allow));
        Assert.Equal("method not allowed: the management port answers GET and HEAD\n", await response.Content.ReadAsStringAsync());
        Assert.Equal(HttpStatusCode.OK, head.StatusCode);
    }

    /// <summary>Methods are case-sensitive: "head" is not HEAD, and was answered as a GET with its body.</summary>
    [Theory]
    [InlineData("head")]
    [InlineData("get")]
    public async Task Management_Endpoints_MethodInAnotherCase_405(string method)
    {
        await using var client = await RawHttp.ConnectAsync(_tern.Config.ManagementPort, tls: false);
        await client.WriteAsync($"{method} /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        var answer = await client.ReadUntilAsync("\0");

        Assert.StartsWith("HTTP/1.1 405 ", answer, StringComparison.Ordinal);
        Assert.Contains("\r\nAllow: GET, HEAD\r\n", answer, StringComparison.Ordinal);
    }

    [Theory]
    [InlineData("/healthz")]
    [InlineData("/readyz")]
    public async Task Management_Endpoints_NeverAnswerOnPublicListener(string path)
    {
        using var client = _tern.CreateClient();
        using var request = new HttpRequestMessage(HttpMethod.Get, new Uri(path, UriKind.Relative));
        request.Headers.Host = $"localhost:{_tern.Config.ManagementPort}";

        using var response = await client.SendAsync(request);

        // Forwarded to the app like any other path (the test upstream has no such endpoint).
        Assert.Equal(HttpStatusCode.NotFound, response.StatusCode);
        Assert.Equal("up", response.Headers.GetValues("X-Upstream").Single());
    }

    [Fact]
    public async Task Transport_IsTernsAcceptLoop_AndItsConnectionsReadIntoThirtyTwoKilobyteBlocks()
    {
        // Kestrel's socket transport asks the services for its memory pool; Tern's gives each
        // socket read two whole TLS records' room (BlockPool). Tern's accept loop must hand it on
        // to the connections it makes, as Kestrel's listener does.
        var factory = _tern.Services.GetRequiredService<IMemoryPoolFactory<byte>>();
        using var pool = factory.Create();
        Assert.Same(BlockPool.Instance, pool);
        Assert.Equal(32 * 1024, pool.MaxBufferSize);

        var transport = Assert.IsType<SocketTransport>(_tern.Services.GetRequiredService<IConnectionListenerFactory>());
        var listener = await transport.BindAsync(new IPEndPoint(IPAddress.Loopback, 0));
        await using (listener)
        {
            using var client = new Socket(AddressFamily.InterNetwork, SocketType.Stream, ProtocolType.Tcp);
            await client.ConnectAsync(listener.EndPoint);
            var connection = await listener.AcceptAsync();
            Assert.NotNull(connection);
            await using (connection)
            {
                Assert.True(connection.Features.Get<IConnectionSocketFeature>()!.Socket.NoDelay);
                await client.SendAsync(new byte[40_000]);

                // The pipe fills its first block before it takes another.
                var input = connection.Transport.Input;
                var read = await input.ReadAsync();
                while (read.Buffer.Length < BlockPool.BlockSize)
                {
                    input.AdvanceTo(read.Buffer.Start, read.Buffer.End);
                    read = await input.ReadAsync();
                }

                Assert.Equal(BlockPool.BlockSize, read.Buffer.First.Length);
                input.AdvanceTo(read.Buffer.End);
            }

            await listener.UnbindAsync();
            Assert.Null(await listener.AcceptAsync());
        }
    }

    [Fact]
    public async Task Readyz_ClusterWithEveryDestinationDown_IsNotReady()
    {
        var dead = FreePort.Next();
        var config = TernConfig.To(engine, _upstream).Route("dead", "dead", "/dead/{**rest}").Cluster("dead", [$"http://127.0.0.1:{dead}/"], new JsonObject
        {
            ["HealthCheck"] = new JsonObject
            {
                ["Active"] = new JsonObject { ["Enabled"] = true, ["Interval"] = "00:00:00.200", ["Timeout"] = "00:00:00.500", ["Path"] = "/" },
            },
        });
        await using var tern = await TernInstance.StartAsync(config);
        using var client = tern.CreatePlainClient(config.ManagementPort);

        // Active health checks mark the destination down after a few failed probes (every 200 ms,
        // each up to 500 ms); up to 20 s, for a loaded machine that runs them late.
        HttpResponseMessage response = null!;
        var body = "";
        for (var i = 0; i < 200 && !body.StartsWith("not ready", StringComparison.Ordinal); i++)
        {
            await Task.Delay(100);
            response = await client.GetAsync(new Uri("/readyz", UriKind.Relative));
            body = await response.Content.ReadAsStringAsync();
        }

        Assert.Equal(HttpStatusCode.ServiceUnavailable, response.StatusCode);
        Assert.Equal("not ready: cluster 'dead' has no destination that is up\n", body);
    }
}

public sealed class OpenSslListenerTests() : ListenerTests(Proxy.Tls.TlsEngines.OpenSsl);

public sealed class SslStreamListenerTests() : ListenerTests(Proxy.Tls.TlsEngines.SslStream);
