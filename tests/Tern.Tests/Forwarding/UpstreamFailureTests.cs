using System.Net;
using System.Net.Security;
using System.Net.Sockets;
using System.Security.Cryptography.X509Certificates;
using System.Text;
using System.Text.Json.Nodes;
using Tern.Tests.Infrastructure;

namespace Tern.Tests.Forwarding;

/// <summary>
/// Upstreams that fail after Tern reached them: each gets a reason that says what the upstream
/// did (the client's plain-text answer and Tern's one log line, which adds what .NET saw), never
/// "could not be reached", and a response the upstream cut short is logged as cut, with the status
/// the client got, never as a client that left. The upstream is a raw socket that misbehaves as
/// its request's path says. Classification does not depend on the TLS engine: default engine only.
/// </summary>
public sealed class UpstreamFailureTests : IAsyncLifetime
{
    private readonly MisbehavingUpstream _plain = new(tls: false);
    private readonly MisbehavingUpstream _tls = new(tls: true);
    private TernInstance _tern = null!;

    public async Task InitializeAsync()
    {
        var config = new TernConfig(Proxy.Tls.TlsEngines.OpenSsl)
            .Route("all", "app", "{**catch-all}")
            .Cluster("app", [_plain.Address], new JsonObject { ["HttpRequest"] = new JsonObject { ["ActivityTimeout"] = "00:00:01" } })
            .Route("tls", "tls", "/tls/{**rest}")
            .Cluster("tls", [_tls.Address])
            .Route("h2", "h2", "/h2/{**rest}")
            .Cluster("h2", [_plain.Address], new JsonObject { ["HttpRequest"] = new JsonObject { ["Version"] = "2", ["VersionPolicy"] = "RequestVersionExact" } });
        _tern = await TernInstance.StartAsync(config);
    }

    public async Task DisposeAsync()
    {
        await _tern.DisposeAsync();
        _plain.Dispose();
        _tls.Dispose();
    }

    [Theory]
    [InlineData("/close", "the upstream closed the connection without answering", "The response ended prematurely")]
    [InlineData("/garbage", "the upstream sent an invalid response", "invalid status line")]
    [InlineData("/bad-header-name", "the upstream sent an invalid response", "invalid header name")]
    [InlineData("/two-lengths", "the upstream sent an invalid response", "Content-Length")]
    [InlineData("/huge-headers", "the upstream's response headers are larger than the 64 KB Tern accepts", "65536 bytes")]
    [InlineData("/switch", "the upstream switched protocols (101) for a request that asked for no upgrade", "upgrade")]
    [InlineData("/tls/x", "Tern could not set up TLS with the upstream", "remote certificate")] // signed by the tests' own CA
    [InlineData("/h2/x", "HTTP/2 with the upstream failed", "HTTP/2")] // an HTTP/1.1 server behind a cluster that requires HTTP/2
    public async Task UpstreamFailsBeforeAnswering_502SaysWhatItDid(string path, string reason, string detail)
    {
        using var client = _tern.CreateClient();
        using var response = await client.GetAsync(path);
        var body = await response.Content.ReadAsStringAsync();

        var cluster = path.Split('/')[1] is "tls" or "h2" ? path.Split('/')[1] : "app";
        Assert.Equal(HttpStatusCode.BadGateway, response.StatusCode);
        if (path == "/h2/x")
        {
            // With HTTP/2's error code when .NET kept it (it races two ways: see Describe).
            Assert.Matches(@"^502 Bad Gateway: HTTP/2 with the upstream failed( \(PROTOCOL_ERROR\))? \(cluster 'h2'\)\n$", body);
        }
        else
        {
            Assert.Equal($"502 Bad Gateway: {reason} (cluster '{cluster}')\n", body);
        }

        var line = await _tern.Logs.WaitForAsync($"GET {path} returned 502: {reason}");
        Assert.Contains(detail, line, StringComparison.Ordinal);
    }

    [Theory]
    [InlineData("/short", "the upstream closed the connection before its response ended (cluster 'app')")]
    [InlineData("/stall", "the upstream of cluster 'app' sent nothing more of its response within HttpRequest:ActivityTimeout")]
    public async Task UpstreamCutsItsResponse_LoggedAsCutWithTheClientsStatus_NotAs499(string path, string reason)
    {
        using var client = _tern.CreateClient();
        using var response = await client.GetAsync(path, HttpCompletionOption.ResponseHeadersRead);
        Assert.Equal(HttpStatusCode.OK, response.StatusCode);
        await Assert.ThrowsAnyAsync<Exception>(() => response.Content.ReadAsByteArrayAsync()); // never taken for whole

        await _tern.Logs.WaitForAsync($"GET {path} was cut short after its 200 response began: {reason} (route all, cluster app, destination d1): ");
        Assert.DoesNotContain(_tern.Logs.Lines, l => l.Contains($"GET {path} returned", StringComparison.Ordinal));
    }

    /// <summary>A 204 with a Content-Length (which a 204 may not have) reaches the client as a 204 without it, as through nginx.</summary>
    [Theory]
    [InlineData("1.1")]
    [InlineData("2.0")]
    public async Task UpstreamSends204WithALength_ClientGets204(string version)
    {
        using var client = _tern.CreateClient(version: Version.Parse(version));
        using var response = await client.GetAsync("/no-content-with-length");

        Assert.Equal(HttpStatusCode.NoContent, response.StatusCode);
        Assert.False(response.Content.Headers.ContentLength > 0);
        Assert.DoesNotContain(_tern.Logs.Lines, l => l.StartsWith("Error:", StringComparison.Ordinal));
    }

    /// <summary>
    /// A 205 with content (Express's sendStatus(205) sends its reason phrase), which a 205 may not
    /// have: Kestrel refuses to send it, and YARP reports that as the client's side failing. The
    /// client gets a 502 that says what the upstream did, not a reset logged as its own leaving
    /// (499).
    /// </summary>
    [Theory]
    [InlineData("1.1")]
    [InlineData("2.0")]
    public async Task UpstreamSends205WithContent_502SaysWhy(string version)
    {
        using var client = _tern.CreateClient(version: Version.Parse(version));
        using var response = await client.GetAsync("/reset-content-with-content");

        Assert.Equal(HttpStatusCode.BadGateway, response.StatusCode);
        Assert.Equal("502 Bad Gateway: the upstream sent a response that cannot be passed on: Responses with status code 205 cannot have a non-zero Content-Length value. (cluster 'app')\n", await response.Content.ReadAsStringAsync());
        await _tern.Logs.WaitForAsync("GET /reset-content-with-content returned 502: the upstream sent a response that cannot be passed on");
        Assert.DoesNotContain(_tern.Logs.Lines, l => l.Contains("GET /reset-content-with-content returned 499", StringComparison.Ordinal));
    }

    /// <summary>
    /// A status below 100 ("099", which .NET reads as 99): passed on, it went out as a status line
    /// of two digits (HTTP/1.1 99), which clients refuse (curl: "Unsupported response code"). A 502
    /// that says so. Three digits above 599 are passed on, as nginx does.
    /// </summary>
    [Theory]
    [InlineData("1.1")]
    [InlineData("2.0")]
    public async Task UpstreamSendsAStatusBelow100_502SaysWhy(string version)
    {
        using var client = _tern.CreateClient(version: Version.Parse(version));
        using var response = await client.GetAsync("/status-099");

        Assert.Equal(HttpStatusCode.BadGateway, response.StatusCode);
        Assert.Equal("502 Bad Gateway: the upstream answered with status 099, which clients cannot read (a status is from 100 to 999) (cluster 'app')\n", await response.Content.ReadAsStringAsync());
        await _tern.Logs.WaitForAsync("GET /status-099 returned 502: the upstream answered with status 099, which clients cannot read (a status is from 100 to 999) (cluster 'app') (route all, cluster app, destination d1): HTTP/1.1 099 Odd");

        using var custom = await client.GetAsync("/status-999");
        Assert.Equal(999, (int)custom.StatusCode);
        Assert.Equal("ok", await custom.Content.ReadAsStringAsync());
    }

    /// <summary>
    /// A client that stops sending its request body mid-way, still connected: after the cluster's
    /// HttpRequest:ActivityTimeout (1 s here) it gets a 408 with the reason, as nginx's
    /// client_body_timeout gives, not a reset logged as a client that left (499).
    /// </summary>
    [Fact]
    public async Task ClientStallsMidUpload_Gets408AfterTheActivityTimeout()
    {
        using var timeout = new CancellationTokenSource(TimeSpan.FromSeconds(15));
        await using var client = await RawHttp.ConnectAsync(_tern.Config.HttpsPort);
        await client.WriteAsync("POST /wait-for-body HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100000\r\n\r\n", timeout.Token);
        await client.WriteAsync(new byte[60_000], timeout.Token);

        var answer = await client.ReadUntilAsync("\r\n0\r\n\r\n", timeout.Token);
        Assert.StartsWith("HTTP/1.1 408 Request Timeout", answer, StringComparison.Ordinal);
        Assert.Contains("Connection: close", answer, StringComparison.OrdinalIgnoreCase);
        Assert.Contains("408 Request Timeout: the request body was rejected (the client sent nothing more of it within the cluster's HttpRequest:ActivityTimeout)\n", answer, StringComparison.Ordinal);
        await _tern.Logs.WaitForAsync("POST /wait-for-body returned 408: the request body was rejected: the client sent nothing more of it");
        Assert.DoesNotContain(_tern.Logs.Lines, l => l.Contains("POST /wait-for-body returned 499", StringComparison.Ordinal));
    }

    /// <summary>Reads one request head, then does what its path asks.</summary>
    private sealed class MisbehavingUpstream : IDisposable
    {
        private readonly RawUpstream _raw;
        private readonly X509Certificate2? _certificate;

        public MisbehavingUpstream(bool tls)
        {
            if (tls)
            {
                var pair = TestPki.Localhost;
                _certificate = X509Certificate2.CreateFromPemFile(pair.CertificatePath, pair.KeyPath);
            }

            _raw = new RawUpstream(ServeAsync, tls ? "https" : "http");
        }

        public string Address => _raw.Address;

        public void Dispose() => _raw.Dispose();

        private async Task ServeAsync(TcpClient client, CancellationToken stop)
        {
            using var _ = client;
            try
            {
                Stream stream = client.GetStream();
                if (_certificate is not null)
                {
                    var ssl = new SslStream(stream);
                    await ssl.AuthenticateAsServerAsync(new SslServerAuthenticationOptions { ServerCertificate = _certificate }, stop);
                    stream = ssl;
                }

                var head = new StringBuilder();
                var buffer = new byte[16 * 1024];
                while (!head.ToString().Contains("\r\n\r\n", StringComparison.Ordinal))
                {
                    var read = await stream.ReadAsync(buffer, stop);
                    if (read == 0)
                    {
                        return;
                    }

                    head.Append(Encoding.Latin1.GetString(buffer, 0, read));
                }

                var path = head.ToString().Split(' ')[1];
                var answer = path switch
                {
                    "/close" => "",
                    "/garbage" => "hello there\r\n\r\n",
                    "/bad-header-name" => "HTTP/1.1 200 OK\r\nX A: b\r\nContent-Length: 2\r\n\r\nok",
                    "/two-lengths" => "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 8\r\n\r\nok",
                    "/huge-headers" => "HTTP/1.1 200 OK\r\n" + string.Concat(Enumerable.Range(0, 70).Select(i => $"X-H{i}: {new string('v', 1000)}\r\n")) + "Content-Length: 2\r\n\r\nok",
                    "/no-content-with-length" => "HTTP/1.1 204 No Content\r\nContent-Length: 8\r\n\r\n",
                    "/reset-content-with-content" => "HTTP/1.1 205 Reset Content\r\nX-Upstream: ok\r\nContent-Length: 13\r\n\r\nReset Content",
                    "/wait-for-body" => "", // answers nothing: the client's body never ends
                    "/switch" => "HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n",
                    "/status-099" => "HTTP/1.1 099 Odd\r\nContent-Length: 2\r\n\r\nok",
                    "/status-999" => "HTTP/1.1 999 Custom\r\nContent-Length: 2\r\n\r\nok",
                    "/short" or "/stall" => "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello",
                    "*" => "HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", // HTTP/2's preface, to an HTTP/1.1 server
                    _ => "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
                };
                await stream.WriteAsync(Encoding.Latin1.GetBytes(answer), stop);
                await stream.FlushAsync(stop);
                if (path == "*")
                {
                    // Closed only once Tern has: closing with its SETTINGS unread would reset the
                    // connection, and Tern would see a reset instead of the answer.
                    client.Client.Shutdown(SocketShutdown.Send);
                    using var drain = CancellationTokenSource.CreateLinkedTokenSource(stop);
                    drain.CancelAfter(TimeSpan.FromSeconds(5));
                    while (await stream.ReadAsync(buffer, drain.Token) > 0)
                    {
                    }
                }

                if (path is "/stall" or "/wait-for-body")
                {
                    await Task.Delay(TimeSpan.FromSeconds(10), stop); // past the cluster's 1 s ActivityTimeout
                }
            }
            catch (Exception e) when (e is IOException or OperationCanceledException or System.Security.Authentication.AuthenticationException)
            {
                // Tern gave up on the connection (as it should on a certificate it does not trust).
            }
        }
    }
}
