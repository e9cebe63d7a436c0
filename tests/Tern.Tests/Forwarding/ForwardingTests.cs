using System.Diagnostics;
using System.Net;
using System.Net.WebSockets;
using System.Security.Cryptography;
using System.Text;
using System.Text.Json.Nodes;
using Tern.Tests.Infrastructure;

namespace Tern.Tests.Forwarding;

public abstract class ForwardingTests(string engine) : IAsyncLifetime
{
    private TestUpstream _upstream = null!;
    private TernInstance _tern = null!;

    public static TheoryData<string, int> VersionsAndSizes() => new()
    {
        { "1.1", 0 }, { "1.1", 1024 }, { "1.1", 10 * 1024 * 1024 },
        { "2.0", 0 }, { "2.0", 1024 }, { "2.0", 10 * 1024 * 1024 },
    };

    public async Task InitializeAsync()
    {
        _upstream = await TestUpstream.StartAsync();
        var config = TernConfig.To(engine, _upstream);
        config.Route("original-host-off", "app", "/dest-host/{**rest}", new JsonObject
        {
            ["Transforms"] = new JsonArray(
                new JsonObject { ["PathRemovePrefix"] = "/dest-host" },
                new JsonObject { ["RequestHeaderOriginalHost"] = "false" }),
        });
        config.Route("append", "app", "/append/{**rest}", new JsonObject
        {
            ["Transforms"] = new JsonArray(
                new JsonObject { ["PathRemovePrefix"] = "/append" },
                new JsonObject { ["X-Forwarded"] = "Append" }),
        });
        // A destination that gives its own Host, on routes that leave the Host to Tern, set it
        // themselves, or ask for the client's.
        config.Cluster("named", [_upstream]);
        config.ReverseProxy["Clusters"]!["named"]!["Destinations"]!["d1"]!["Host"] = "app.internal";
        foreach (var (id, transform) in (ValueTuple<string, JsonObject?>[])[
            ("named", null),
            ("named-set", new JsonObject { ["RequestHeader"] = "Host", ["Set"] = "route.test" }),
            ("named-same", new JsonObject { ["RequestHeader"] = "host", ["Set"] = $"shop.test:{config.HttpsPort}" }), // the client's own, set by the route
            ("named-original", new JsonObject { ["RequestHeaderOriginalHost"] = "true" })])
        {
            var transforms = new JsonArray(new JsonObject { ["PathRemovePrefix"] = $"/{id}" });
            if (transform is not null)
            {
                transforms.Add(transform);
            }

            config.Route(id, "named", $"/{id}/{{**rest}}", new JsonObject { ["Transforms"] = transforms, ["Metadata"] = new JsonObject { ["Tern.AllowPlainHttp"] = "true" } });
        }

        // The Host from a route value where there is one (YARP's RequestHeaderRouteValue), the destination's where not.
        config.Route("named-site", "named", "/named-site/{site?}", new JsonObject
        {
            ["Transforms"] = new JsonArray(new JsonObject { ["PathSet"] = "/headers" }, new JsonObject { ["RequestHeaderRouteValue"] = "Host", ["Set"] = "site" }),
        });

        _tern = await TernInstance.StartAsync(config);
    }

    public async Task DisposeAsync()
    {
        await _tern.DisposeAsync();
        await _upstream.DisposeAsync();
    }

    [Fact]
    public async Task ClientResetDuringUpload_IsLoggedAs499_NotBlamedOnTheUpstream()
    {
        await using (var client = await RawHttp.ConnectAsync(_tern.Config.HttpsPort))
        {
            await client.WriteAsync("POST /echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1048576\r\n\r\n");
            await client.WriteAsync(new byte[256 * 1024]);
            await Task.Delay(200); // the forwarder is copying the body to the upstream

            // An abortive close: RST, as a client that crashed or gave up.
            client.Socket.LingerState = new System.Net.Sockets.LingerOption(true, 0);
            client.Socket.Close();
        }

        await _tern.Logs.WaitForAsync("POST /echo returned 499: the client closed the connection");
        Assert.DoesNotContain(_tern.Logs.Lines, l => l.Contains("returned 502", StringComparison.Ordinal));

        // Kestrel must not try to drain a body the forwarder still has a read on: it logged that
        // as an error ("automatic draining of the request body failed") for every such client.
        await Task.Delay(300);
        Assert.DoesNotContain(_tern.Logs.Lines, l => l.StartsWith("Error:", StringComparison.Ordinal) || l.StartsWith("Critical:", StringComparison.Ordinal));
    }

    /// <summary>
    /// An HTTP/2 upstream may answer before it has read the request body; YARP then copies the whole
    /// response and reports the body's copy as failed on the client's side. The client is still
    /// there and must get all of the answer (a first version of the 499 path aborted it). Over
    /// HTTP/1.1 the rest of the body is then drained and the connection kept for the next request,
    /// with nothing in the log above Information. (Of these cases only "1.1" failed before
    /// RequestBodyReads: Kestrel's chunked body reader survived YARP's cancelled read.)
    /// </summary>
    [Theory]
    [InlineData("1.1")]
    [InlineData("1.1 chunked")]
    [InlineData("1.1 whole body, answer after 500 ms")]
    [InlineData("2.0")]
    public async Task UpstreamAnswersBeforeReadingTheBody_ClientGetsTheWholeAnswer(string version)
    {
        await using var early = await TestUpstream.StartAsync("early", http2: true);
        await using var tern = await StartInFrontOfH2cAsync(early);
        using var timeout = new CancellationTokenSource(TimeSpan.FromSeconds(10));
        if (version == "2.0")
        {
            // 64 KB of a body that never ends: the upstream answers without waiting for it.
            using var h2 = tern.CreateClient(version: HttpVersion.Version20);
            using var response = await h2.PostAsync(new Uri("/early", UriKind.Relative), new EndlessContent(), timeout.Token);
            var answer = await response.Content.ReadAsByteArrayAsync(timeout.Token);

            Assert.Equal(HttpStatusCode.OK, response.StatusCode);
            Assert.Equal(100 * 1024, answer.Length);
            await Task.Delay(300);
            Assert.DoesNotContain(tern.Logs.Lines, l => l.Contains(": Tern.Proxy.Forwarding: ", StringComparison.Ordinal)); // nothing failed: no 499, no "cut short"
            return;
        }

        // .NET's HTTP/1.1 client sends the whole body before it reads: by hand, 64 KB of 1 MB, the
        // rest after the answer. Or all of it at once, while the upstream waits before answering:
        // Tern is then mid-write to the upstream when the upstream ends the stream, and YARP
        // reports the body's copy as the destination's failure, with the answer whole.
        var chunked = version.EndsWith("chunked", StringComparison.Ordinal);
        var whole = version.Contains("whole", StringComparison.Ordinal);
        await using var client = await RawHttp.ConnectAsync(tern.Config.HttpsPort);
        await client.WriteAsync($"POST /early{(whole ? "?delay=500" : "")} HTTP/1.1\r\nHost: localhost\r\n" + (chunked ? "Transfer-Encoding: chunked" : "Content-Length: 1048576") + "\r\n\r\n", timeout.Token);
        var sent = WriteBodyPartAsync(whole ? 1024 * 1024 : 64 * 1024);
        var answered = await client.ReadUntilAsync("\r\n0\r\n\r\n", timeout.Token);
        Assert.StartsWith("HTTP/1.1 200", answered, StringComparison.Ordinal);
        Assert.EndsWith("\r\n0\r\n\r\n", answered, StringComparison.Ordinal);
        await sent;

        // The rest of the body, then a second request on the same connection.
        await WriteBodyPartAsync(whole ? 0 : 1024 * 1024 - 64 * 1024);
        if (chunked)
        {
            await client.WriteAsync("0\r\n\r\n", timeout.Token);
        }

        await client.WriteAsync("GET /name HTTP/1.1\r\nHost: localhost\r\n\r\n", timeout.Token);
        var next = await client.ReadUntilAsync("\r\n0\r\n\r\n", timeout.Token);
        Assert.StartsWith("HTTP/1.1 200", next, StringComparison.Ordinal);
        Assert.Contains("\r\nearly\r\n", next, StringComparison.Ordinal);

        // Neither a client that went away (499) nor Kestrel's error that it could not drain the
        // body (the forwarder's cancelled read used to leave Kestrel's body reader mid-read:
        // dotnet/aspnetcore#17840).
        await Task.Delay(300);
        Assert.DoesNotContain(tern.Logs.Lines, l => l.Contains(": Tern.Proxy.Forwarding: ", StringComparison.Ordinal)); // nothing failed: no 499, no "cut short"
        Assert.DoesNotContain(tern.Logs.Lines, l => l.StartsWith("Error:", StringComparison.Ordinal) || l.StartsWith("Critical:", StringComparison.Ordinal));

        async Task WriteBodyPartAsync(int length)
        {
            if (length == 0)
            {
                return;
            }

            await client.WriteAsync(chunked ? $"{length:x}\r\n" : "", timeout.Token);
            await client.WriteAsync(new byte[length], timeout.Token);
            await client.WriteAsync(chunked ? "\r\n" : "", timeout.Token);
        }
    }

    /// <summary>
    /// An upstream that refuses an upload at once with no content (a 401 or 413 with
    /// Content-Length: 0): YARP reports the body's copy as failed before the response has started,
    /// as nothing of it was written yet. The client still gets the status, not a reset logged as
    /// a 499.
    /// </summary>
    [Theory]
    [InlineData("1.1")]
    [InlineData("2.0")]
    public async Task UpstreamRefusesTheBodyWithoutContent_ClientGetsTheStatus(string version)
    {
        await using var early = await TestUpstream.StartAsync("early", http2: true);
        await using var tern = await StartInFrontOfH2cAsync(early);
        using var timeout = new CancellationTokenSource(TimeSpan.FromSeconds(10));
        if (version == "2.0")
        {
            using var h2 = tern.CreateClient(version: HttpVersion.Version20);
            using var response = await h2.PostAsync(new Uri("/early-empty", UriKind.Relative), new EndlessContent(), timeout.Token);
            Assert.Equal(HttpStatusCode.Unauthorized, response.StatusCode);
            Assert.Empty(await response.Content.ReadAsByteArrayAsync(timeout.Token));
        }
        else
        {
            await using var client = await RawHttp.ConnectAsync(tern.Config.HttpsPort);
            await client.WriteAsync("POST /early-empty HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1048576\r\n\r\n", timeout.Token);
            await client.WriteAsync(new byte[64 * 1024], timeout.Token);
            var answered = await client.ReadUntilAsync("\r\n\r\n", timeout.Token);
            Assert.StartsWith("HTTP/1.1 401", answered, StringComparison.Ordinal);
        }

        await Task.Delay(300);
        Assert.DoesNotContain(tern.Logs.Lines, l => l.Contains("returned 499", StringComparison.Ordinal));
    }

    /// <summary>
    /// After an early answer, Kestrel drains the rest of an HTTP/1.1 body for at most 5 s; a client
    /// that stops sending it has its connection ended then, and nothing is logged as an error.
    /// </summary>
    [Fact]
    public async Task UpstreamAnswersEarly_BodyNeverFinished_ConnectionClosesAfterTheDrainLimit()
    {
        await using var early = await TestUpstream.StartAsync("early", http2: true);
        await using var tern = await StartInFrontOfH2cAsync(early);
        using var timeout = new CancellationTokenSource(TimeSpan.FromSeconds(15));
        await using var client = await RawHttp.ConnectAsync(tern.Config.HttpsPort);
        await client.WriteAsync("POST /early HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1048576\r\n\r\n", timeout.Token);
        await client.WriteAsync(new byte[64 * 1024], timeout.Token);
        var answered = await client.ReadUntilAsync("\r\n0\r\n\r\n", timeout.Token);
        Assert.StartsWith("HTTP/1.1 200", answered, StringComparison.Ordinal);

        var watch = Stopwatch.StartNew();
        string after;
        try
        {
            after = await client.ReadUntilAsync("\r\n\r\n", timeout.Token);
        }
        catch (IOException)
        {
            after = ""; // Kestrel aborts a connection whose body it could not drain: a reset
        }

        Assert.Equal("", after); // closed, nothing more sent
        Assert.InRange(watch.Elapsed, TimeSpan.FromSeconds(3), TimeSpan.FromSeconds(12));
        Assert.DoesNotContain(tern.Logs.Lines, l => l.StartsWith("Error:", StringComparison.Ordinal) || l.StartsWith("Critical:", StringComparison.Ordinal));
    }

    /// <summary>An HTTP/2 upstream that resets its stream mid-response: logged as cut, with the code it reset with.</summary>
    [Fact]
    public async Task Http2UpstreamResetsMidResponse_LoggedAsCutWithItsErrorCode()
    {
        await using var upstream = await TestUpstream.StartAsync("h2", http2: true);
        await using var tern = await StartInFrontOfH2cAsync(upstream);
        using var client = tern.CreateClient();
        using var response = await client.GetAsync("/reset-mid-body", HttpCompletionOption.ResponseHeadersRead);
        await Assert.ThrowsAnyAsync<Exception>(() => response.Content.ReadAsByteArrayAsync()); // never taken for whole

        await tern.Logs.WaitForAsync("GET /reset-mid-body was cut short after its 200 response began: HTTP/2 with the upstream failed (INTERNAL_ERROR) (cluster 'h2c')");
    }

    /// <summary>
    /// A gRPC-shaped duplex call through Tern: each message crosses both ways before the next is
    /// sent (so nothing on the way may hold bytes back waiting for more), and the upstream's
    /// trailers (grpc-status) reach the client.
    /// </summary>
    [Fact]
    public async Task GrpcShapedDuplexCall_EchoesEachMessageBeforeTheNext_AndForwardsTrailers()
    {
        await using var grpc = await TestUpstream.StartAsync("grpc", http2: true);
        await using var tern = await StartInFrontOfH2cAsync(grpc);
        using var timeout = new CancellationTokenSource(TimeSpan.FromSeconds(20));
        using var client = tern.CreateClient(version: HttpVersion.Version20);
        var messages = new[] { 5, 1, 17_000, 300, 70_000 }.Select(TestUpstream.Pattern).ToArray();
        var body = new DuplexContent();
        using var request = new HttpRequestMessage(HttpMethod.Post, new Uri("/duplex", UriKind.Relative)) { Content = body, Version = HttpVersion.Version20, VersionPolicy = HttpVersionPolicy.RequestVersionExact };
        var sending = client.SendAsync(request, HttpCompletionOption.ResponseHeadersRead, timeout.Token);

        // As a gRPC client does, the first message goes before the response's headers come: YARP
        // sends those with the first piece of the response body.
        var stream = await body.Stream.WaitAsync(timeout.Token);
        await stream.WriteAsync(messages[0], timeout.Token);
        await stream.FlushAsync(timeout.Token);
        using var response = await sending;
        Assert.Equal(HttpStatusCode.OK, response.StatusCode);
        await using var answers = await response.Content.ReadAsStreamAsync(timeout.Token);
        for (var i = 0; i < messages.Length; i++)
        {
            var message = messages[i];
            if (i > 0)
            {
                await stream.WriteAsync(message, timeout.Token);
                await stream.FlushAsync(timeout.Token);
            }

            var echoed = new byte[message.Length];
            await answers.ReadExactlyAsync(echoed, timeout.Token);
            Assert.Equal(message, echoed);
        }

        body.Done.SetResult();
        Assert.Equal(0, await answers.ReadAsync(new byte[1], timeout.Token));
        Assert.Equal("0", response.TrailingHeaders.GetValues("grpc-status").Single());
        Assert.Equal(messages.Sum(m => m.Length).ToString(System.Globalization.CultureInfo.InvariantCulture), response.TrailingHeaders.GetValues("x-received").Single());
    }

    /// <summary>A request body the test writes while the response is read.</summary>
    private sealed class DuplexContent : HttpContent
    {
        private readonly TaskCompletionSource<Stream> _stream = new(TaskCreationOptions.RunContinuationsAsynchronously);

        public DuplexContent() => Headers.ContentType = new System.Net.Http.Headers.MediaTypeHeaderValue("application/grpc");

        public Task<Stream> Stream => _stream.Task;

        public TaskCompletionSource Done { get; } = new(TaskCreationOptions.RunContinuationsAsynchronously);

        protected override Task SerializeToStreamAsync(Stream stream, System.Net.TransportContext? context) => SerializeToStreamAsync(stream, context, CancellationToken.None);

        protected override async Task SerializeToStreamAsync(Stream stream, System.Net.TransportContext? context, CancellationToken cancellationToken)
        {
            _stream.SetResult(stream);
            await Done.Task.WaitAsync(cancellationToken);
        }

        protected override bool TryComputeLength(out long length)
        {
            length = 0;
            return false;
        }
    }

    /// <summary>Tern with one route to <paramref name="upstream"/> over h2c (HTTP/2 without TLS, as gRPC backends speak it).</summary>
    private Task<TernInstance> StartInFrontOfH2cAsync(TestUpstream upstream) =>
        TernInstance.StartAsync(new TernConfig(engine).Route("all", "h2c", "{**catch-all}")
            .Cluster("h2c", [upstream], new JsonObject { ["HttpRequest"] = new JsonObject { ["Version"] = "2", ["VersionPolicy"] = "RequestVersionExact" } }));

    private sealed class EndlessContent : HttpContent
    {
        protected override Task SerializeToStreamAsync(Stream stream, System.Net.TransportContext? context) => SerializeToStreamAsync(stream, context, CancellationToken.None);

        protected override async Task SerializeToStreamAsync(Stream stream, System.Net.TransportContext? context, CancellationToken cancellationToken)
        {
            await stream.WriteAsync(new byte[64 * 1024], cancellationToken);
            await stream.FlushAsync(cancellationToken);
            await Task.Delay(Timeout.Infinite, cancellationToken);
        }

        protected override bool TryComputeLength(out long length)
        {
            length = 0;
            return false;
        }
    }

    [Theory]
    [InlineData("Transfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\nzz\r\n", "HTTP/1.1 400")] // a bad chunk
    [InlineData("Transfer-Encoding: chunked\r\n\r\n80000000\r\nabc\r\n", "HTTP/1.1 400")] // a chunk size of 2^31: Kestrel throws an IOException, not its BadHttpRequestException
    [InlineData("Content-Length: 40000000\r\n\r\n", "HTTP/1.1 413")] // over Kestrel's 30 MB limit
    public async Task BodyKestrelRefuses_GetsKestrelsStatusWithAReason_NotBlamedOnTheUpstream(string framing, string status)
    {
        await using var client = await RawHttp.ConnectAsync(_tern.Config.HttpsPort);
        using var timeout = new CancellationTokenSource(TimeSpan.FromSeconds(10));
        await client.WriteAsync("POST /echo HTTP/1.1\r\nHost: localhost\r\n" + framing, timeout.Token);
        var response = await client.ReadUntilAsync("\0", timeout.Token); // to the end: Tern closes after a refused body

        Assert.StartsWith(status, response, StringComparison.Ordinal);
        Assert.Contains("the request body was rejected", response, StringComparison.Ordinal);
        Assert.DoesNotContain(_tern.Logs.Lines, l => l.Contains("returned 502", StringComparison.Ordinal) || l.Contains("returned 499", StringComparison.Ordinal) || l.Contains(": the client went away", StringComparison.Ordinal));
    }

    [Theory]
    [InlineData("1.1")]
    [InlineData("2.0")]
    public async Task Get_OverTls_UsesRequestedHttpVersion(string version)
    {
        using var client = _tern.CreateClient(version: Version.Parse(version));

        using var response = await client.GetAsync(new Uri("/name", UriKind.Relative));

        Assert.Equal(HttpStatusCode.OK, response.StatusCode);
        Assert.Equal(Version.Parse(version), response.Version);
        Assert.Equal("up", await response.Content.ReadAsStringAsync());
    }

    [Theory]
    [MemberData(nameof(VersionsAndSizes))]
    public async Task Post_Body_ArrivesAndReturnsByteForByte(string version, int size)
    {
        using var client = _tern.CreateClient(version: Version.Parse(version));
        var body = TestUpstream.Pattern(size);

        using var response = await client.PostAsync(new Uri("/echo", UriKind.Relative), new ByteArrayContent(body));
        var echoed = await response.Content.ReadAsByteArrayAsync();

        Assert.Equal(HttpStatusCode.OK, response.StatusCode);
        Assert.Equal(size, echoed.Length);
        Assert.Equal(SHA256.HashData(body), SHA256.HashData(echoed));
    }

    [Theory]
    [MemberData(nameof(VersionsAndSizes))]
    public async Task Get_ResponseBody_ArrivesByteForByte(string version, int size)
    {
        using var client = _tern.CreateClient(version: Version.Parse(version));

        var received = await client.GetByteArrayAsync(new Uri($"/bytes/{size}", UriKind.Relative));

        Assert.Equal(SHA256.HashData(TestUpstream.Pattern(size)), SHA256.HashData(received));
    }

    [Fact]
    public async Task Post_ChunkedUpload_ArrivesChunkedAndWhole()
    {
        using var client = _tern.CreateClient();
        var body = TestUpstream.Pattern(3 * 1024 * 1024 + 17);
        using var content = new StreamContent(new UnknownLengthStream(body));
        using var request = new HttpRequestMessage(HttpMethod.Post, new Uri("/echo", UriKind.Relative)) { Content = content };
        request.Headers.TransferEncodingChunked = true;

        using var response = await client.SendAsync(request);
        var echoed = await response.Content.ReadAsByteArrayAsync();

        Assert.Equal(HttpStatusCode.OK, response.StatusCode);
        Assert.Equal("true", response.Headers.GetValues("X-Received-Chunked").Single());
        Assert.Equal(SHA256.HashData(body), SHA256.HashData(echoed));
    }

    /// <summary>
    /// A WebSocket that carries nothing for the cluster's activity timeout is closed, as configured,
    /// and logged as idle at Information: not as an upstream that failed or a client that left.
    /// </summary>
    [Fact]
    public async Task WebSocket_IdleForTheActivityTimeout_IsClosedAndLoggedAsIdle()
    {
        var config = TernConfig.To(engine, _upstream);
        config.Cluster("app", [_upstream], new JsonObject { ["HttpRequest"] = new JsonObject { ["ActivityTimeout"] = "00:00:01" } });
        await using var tern = await TernInstance.StartAsync(config);
        using var socket = new ClientWebSocket();
        socket.Options.RemoteCertificateValidationCallback = (_, _, _, _) => true;
        await socket.ConnectAsync(new Uri($"wss://localhost:{tern.Config.HttpsPort}/ws"), CancellationToken.None);

        using var timeout = new CancellationTokenSource(TimeSpan.FromSeconds(10));
        await Assert.ThrowsAnyAsync<Exception>(async () => await socket.ReceiveAsync(new byte[16], timeout.Token)); // closed under it after 1 s
        Assert.False(timeout.IsCancellationRequested);

        await tern.Logs.WaitForAsync("GET /ws: the upgraded connection (a WebSocket, say) carried nothing for the cluster's HttpRequest:ActivityTimeout and was closed (route all, cluster app, destination d1)");
        Assert.DoesNotContain(tern.Logs.Lines, l => l.StartsWith("Warning: Tern.Proxy.Forwarding", StringComparison.Ordinal) || l.Contains("returned 499", StringComparison.Ordinal) || l.Contains(": the client went away", StringComparison.Ordinal));
    }

    /// <summary>
    /// A client that stops reading a response for the cluster's activity timeout has its connection
    /// (HTTP/1.1) ended, as configured. It is still connected, so the log says it stopped reading, at
    /// Information: not that it went away (307), nor that the upstream failed.
    /// </summary>
    [Fact]
    public async Task ClientThatStopsReading_ForTheActivityTimeout_IsClosedAndLoggedAsNotReading()
    {
        var config = TernConfig.To(engine, _upstream);
        config.Cluster("app", [_upstream], new JsonObject { ["HttpRequest"] = new JsonObject { ["ActivityTimeout"] = "00:00:02" } });
        await using var tern = await TernInstance.StartAsync(config);
        // Three clients, 16 MB each, never read. Rarely, Kestrel's abort of a connection whose write
        // was cancelled reaches YARP before YARP has read why, and YARP then reports the client as
        // gone (event 307): so each may log either, and at least one must log event 306.
        var paths = new[] { "/bytes/16777216", "/bytes/16777217", "/bytes/16777218" };
        var clients = new List<RawHttp>();
        try
        {
            foreach (var path in paths)
            {
                var client = await RawHttp.ConnectAsync(tern.Config.HttpsPort);
                clients.Add(client);
                client.Socket.ReceiveBufferSize = 64 * 1024;
                await client.WriteAsync($"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
            }

            string? Outcome(string path) => tern.Logs.Lines.FirstOrDefault(l => l.Contains($"GET {path}: the client read nothing more", StringComparison.Ordinal) || l.Contains($"GET {path}: the client went away", StringComparison.Ordinal));
            var deadline = DateTime.UtcNow + TimeSpan.FromSeconds(30);
            while (paths.Any(p => Outcome(p) is null) && DateTime.UtcNow < deadline)
            {
                await Task.Delay(100);
            }

            var outcomes = paths.Select(Outcome).ToList();
            var logged = string.Join("\n", tern.Logs.Lines);
            Assert.All(outcomes, o => Assert.True(o is not null && (o.Contains(": the client went away during its 200 response", StringComparison.Ordinal) || o.EndsWith(
                ": the client read nothing more of its 200 response for the cluster's HttpRequest:ActivityTimeout, so Tern ended it (its connection over HTTP/1.1, its stream over HTTP/2) (route all, cluster app, destination d1)", StringComparison.Ordinal)), logged));
            Assert.Contains(outcomes, o => o!.Contains(": the client read nothing more", StringComparison.Ordinal));
            Assert.DoesNotContain(tern.Logs.Lines, l => l.StartsWith("Warning: Tern.Proxy.Forwarding", StringComparison.Ordinal));
        }
        finally
        {
            foreach (var client in clients)
            {
                await client.DisposeAsync();
            }
        }

        // A client that leaves, by reset, while the upstream is still sending (a 64 KB piece every
        // 50 ms) is still one that closed the connection.
        await using (var leaving = await RawHttp.ConnectAsync(tern.Config.HttpsPort))
        {
            await leaving.WriteAsync("GET /stream/100/50 HTTP/1.1\r\nHost: localhost\r\n\r\n");
            await leaving.Stream.ReadExactlyAsync(new byte[32 * 1024]);
            leaving.Socket.LingerState = new System.Net.Sockets.LingerOption(true, 0);
            leaving.Socket.Close();
        }

        await tern.Logs.WaitForAsync("GET /stream/100/50: the client went away during its 200 response (it closed its connection, or reset its stream over HTTP/2) (route all)");
        Assert.DoesNotContain(tern.Logs.Lines, l => l.Contains("GET /stream/100/50 returned", StringComparison.Ordinal));
        Assert.DoesNotContain(tern.Logs.Lines, l => l.Contains("GET /stream/100/50: the client read nothing more", StringComparison.Ordinal));
    }

    /// <summary>Over HTTP/1.1 an Upgrade; over HTTP/2 an extended CONNECT (RFC 8441), which YARP sends the upstream as an Upgrade.</summary>
    [Theory]
    [InlineData("1.1")]
    [InlineData("2.0")]
    public async Task WebSocket_ThroughProxy_Echoes(string version)
    {
        using var socket = new ClientWebSocket();
        socket.Options.HttpVersion = Version.Parse(version);
        socket.Options.HttpVersionPolicy = HttpVersionPolicy.RequestVersionExact;
        using var handler = new SocketsHttpHandler { SslOptions = { RemoteCertificateValidationCallback = (_, _, _, _) => true } };
        using var invoker = new HttpMessageInvoker(handler);
        await socket.ConnectAsync(new Uri($"wss://localhost:{_tern.Config.HttpsPort}/ws"), invoker, CancellationToken.None);
        var buffer = new byte[256 * 1024];

        foreach (var message in new[] { Encoding.UTF8.GetBytes("hello tern"), TestUpstream.Pattern(100_000) })
        {
            await socket.SendAsync(message, WebSocketMessageType.Binary, true, CancellationToken.None);
            var received = 0;
            WebSocketReceiveResult result;
            do
            {
                result = await socket.ReceiveAsync(new ArraySegment<byte>(buffer, received, buffer.Length - received), CancellationToken.None);
                received += result.Count;
            }
            while (!result.EndOfMessage);

            Assert.Equal(message, buffer[..received]);
        }

        await socket.CloseAsync(WebSocketCloseStatus.NormalClosure, "done", CancellationToken.None);
    }

    /// <summary>
    /// A WebSocket over HTTP/2 to a path where the upstream takes none: it answers YARP's Upgrade
    /// with a page (200), where over HTTP/2 a 200 says the WebSocket was taken. Before, Kestrel
    /// refused the page's body, and the 502 said that. A 502 that says the upstream took no WebSocket.
    /// </summary>
    [Theory]
    [InlineData("/name")] // chunked
    [InlineData("/bytes/10")] // with a Content-Length
    public async Task WebSocketOverHttp2_UpstreamAnswersWithAPage_502SaysItTakesNoWebSocket(string path)
    {
        using var socket = new ClientWebSocket();
        socket.Options.HttpVersion = HttpVersion.Version20;
        socket.Options.HttpVersionPolicy = HttpVersionPolicy.RequestVersionExact;
        socket.Options.CollectHttpResponseDetails = true;
        using var handler = new SocketsHttpHandler { SslOptions = { RemoteCertificateValidationCallback = (_, _, _, _) => true } };
        using var invoker = new HttpMessageInvoker(handler);

        await Assert.ThrowsAsync<WebSocketException>(() => socket.ConnectAsync(new Uri($"wss://localhost:{_tern.Config.HttpsPort}{path}"), invoker, CancellationToken.None));

        Assert.Equal(HttpStatusCode.BadGateway, socket.HttpStatusCode);
        var line = await _tern.Logs.WaitForAsync($"CONNECT {path} returned 502: the upstream answered the WebSocket's request with 200, not 101 Switching Protocols: it takes no WebSocket at this path (cluster 'app')");
        Assert.EndsWith("a WebSocket over HTTP/2, sent to the upstream as an HTTP/1.1 Upgrade", line, StringComparison.Ordinal);
    }

    [Fact]
    public async Task Headers_FromUntrustedClient_DescribeRealClientAndKeepOriginalHost()
    {
        using var client = _tern.CreateClient(host: "shop.test");
        using var request = new HttpRequestMessage(HttpMethod.Get, new Uri("/headers", UriKind.Relative));
        request.Headers.Add("X-Forwarded-For", "6.6.6.6");
        request.Headers.Add("X-Forwarded-Proto", "gopher");
        request.Headers.Add("X-Forwarded-Host", "evil.test");
        request.Headers.Add("Forwarded", "for=6.6.6.6");

        using var response = await client.SendAsync(request);
        var headers = TestUpstream.ParseHeaders(await response.Content.ReadAsStringAsync());

        Assert.Equal("127.0.0.1", headers["X-Forwarded-For"]);
        Assert.Equal("https", headers["X-Forwarded-Proto"]);
        Assert.Equal($"shop.test:{_tern.Config.HttpsPort}", headers["X-Forwarded-Host"]);
        Assert.Equal($"shop.test:{_tern.Config.HttpsPort}", headers["Host"]);
        Assert.False(headers.ContainsKey("Forwarded"));
    }

    [Fact]
    public async Task Headers_RouteTurnsOriginalHostOff_UpstreamSeesItsOwnHost()
    {
        using var client = _tern.CreateClient(host: "shop.test");

        var headers = TestUpstream.ParseHeaders(await client.GetStringAsync(new Uri("/dest-host/headers", UriKind.Relative)));

        Assert.Equal(_upstream.Address.Authority, headers["Host"]);
        Assert.Equal($"shop.test:{_tern.Config.HttpsPort}", headers["X-Forwarded-Host"]);
    }

    /// <summary>
    /// A destination's own Host (YARP's Destinations:d1:Host) is what its upstream gets, where the
    /// route leaves the Host to Tern: with Tern's default of the client's Host it was dropped without
    /// a word. A route's own Host transform, or its explicit RequestHeaderOriginalHost, wins.
    /// </summary>
    [Theory]
    [InlineData("/named/headers", "app.internal")]
    [InlineData("/named-set/headers", "route.test")]
    [InlineData("/named-same/headers", null)]
    [InlineData("/named-original/headers", null)]
    [InlineData("/named-site/site.test", "site.test")]
    [InlineData("/named-site", "app.internal")] // no route value: nothing set by the route
    public async Task Headers_DestinationWithItsOwnHost_UpstreamGetsIt_UnlessTheRouteSaysOtherwise(string path, string? host)
    {
        using var client = _tern.CreateClient(host: "shop.test");

        var headers = TestUpstream.ParseHeaders(await client.GetStringAsync(new Uri(path, UriKind.Relative)));

        Assert.Equal(host ?? $"shop.test:{_tern.Config.HttpsPort}", headers["Host"]);
        Assert.Equal($"shop.test:{_tern.Config.HttpsPort}", headers["X-Forwarded-Host"]);
    }

    /// <summary>
    /// A client's Host in punycode: the destination's own Host is sent all the same, and
    /// X-Forwarded-Host carries the name as the client wrote it (ASP.NET Core's Request.Host
    /// decodes it: bücher.example, which went as Latin-1 bytes).
    /// </summary>
    [Fact]
    public async Task Headers_InternationalHostInPunycode_PassedAsWritten()
    {
        using var client = _tern.CreateClient(host: "xn--bcher-kva.example");

        var headers = TestUpstream.ParseHeaders(await client.GetStringAsync(new Uri("/named/headers", UriKind.Relative)));

        Assert.Equal("app.internal", headers["Host"]);
        Assert.Equal($"xn--bcher-kva.example:{_tern.Config.HttpsPort}", headers["X-Forwarded-Host"]);
    }

    /// <summary>
    /// An upstream that builds its redirects from the Host it got (a destination's own Host) has
    /// them made the client's, as those to its address: the internal name does not reach the client.
    /// </summary>
    [Theory]
    [InlineData("https", "http://app.internal/login", "/named/login")] // an app that sees plain HTTP
    [InlineData("https", "https://APP.internal/login?next=%2F", "/named/login?next=%2F")] // built from X-Forwarded-Proto, in any case
    [InlineData("https", "http://app.internal:8080/login", "http://app.internal:8080/login")] // another port: not the destination
    [InlineData("http", "http://app.internal/login", "/named/login")]
    [InlineData("http", "https://app.internal/login", "https://app.internal/login")] // sending a plain-HTTP client to TLS: a path would send it back, again and again
    [InlineData("https", "https://app.internal/\\evil.com/x", "/named/\\evil.com/x")] // under the prefix, still this site (HeaderDefaultsTests has the route without one)
    public async Task Redirect_ToTheDestinationsOwnHost_MadeTheClients(string scheme, string location, string expected)
    {
        using var client = scheme == "https" ? _tern.CreateClient(host: "shop.test") : _tern.CreatePlainClient(_tern.Config.HttpPort, "shop.test");

        using var response = await client.GetAsync(new Uri($"/named/redirect?to={Uri.EscapeDataString(location)}", UriKind.Relative));

        Assert.Equal(HttpStatusCode.Found, response.StatusCode);
        Assert.Equal(expected, Assert.Single(response.Headers.NonValidated["Location"]));
    }

    [Fact]
    public async Task Headers_FromTrustedProxy_AreAppendedTo()
    {
        var config = TernConfig.To(engine, _upstream);
        config.Tern["Forwarding"] = new JsonObject { ["TrustedProxies"] = new JsonArray("127.0.0.0/8") };
        await using var tern = await TernInstance.StartAsync(config);
        using var client = tern.CreateClient();
        using var request = new HttpRequestMessage(HttpMethod.Get, new Uri("/headers", UriKind.Relative));
        request.Headers.Add("X-Forwarded-For", "203.0.113.9");
        request.Headers.Add("X-Forwarded-Proto", "http");
        request.Headers.Add("X-Forwarded-Host", "www.example.com");

        using var response = await client.SendAsync(request);
        var headers = TestUpstream.ParseHeaders(await response.Content.ReadAsStringAsync());

        Assert.Equal("203.0.113.9, 127.0.0.1", headers["X-Forwarded-For"]);
        Assert.Equal("http", headers["X-Forwarded-Proto"]);
        Assert.Equal("www.example.com", headers["X-Forwarded-Host"]);
    }

    [Fact]
    public async Task RoundRobin_TwoUpstreams_ShareRequestsEvenly()
    {
        await using var second = await TestUpstream.StartAsync("second");
        var config = TernConfig.To(engine, _upstream, second);
        ((JsonObject)config.ReverseProxy["Clusters"]!["app"]!)["LoadBalancingPolicy"] = "RoundRobin";
        await using var tern = await TernInstance.StartAsync(config);
        using var client = tern.CreateClient();

        var names = new List<string>();
        for (var i = 0; i < 10; i++)
        {
            names.Add(await client.GetStringAsync(new Uri("/name", UriKind.Relative)));
        }

        Assert.Equal(5, names.Count(n => n == "up"));
        Assert.Equal(5, names.Count(n => n == "second"));
        Assert.All(names.Zip(names.Skip(1)), pair => Assert.NotEqual(pair.First, pair.Second));
    }

    [Fact]
    public async Task UpstreamDown_Returns502PromptlyWithReason()
    {
        var deadPort = FreePort.Next();
        var config = new TernConfig(engine).Route("all", "dead", "{**any}").Cluster("dead", [$"http://127.0.0.1:{deadPort}/"]);

        var (status, body, contentType, elapsed) = await SecondRequestAsync(config);

        Assert.Equal(HttpStatusCode.BadGateway, status);
        Assert.Equal("502 Bad Gateway: the upstream refused the connection (cluster 'dead')\n", body);
        Assert.StartsWith("text/plain", contentType, StringComparison.Ordinal);

        // A refusal is answered at once; 3 s leaves room for a loaded machine and still rules out
        // retrying the connect (the message says the refusal is why).
        Assert.True(elapsed < TimeSpan.FromSeconds(3), $"took {elapsed}");
    }

    /// <summary>Through a cluster's forward proxy, a refused connection is the proxy's, and the 502 says so (before: "the upstream refused the connection").</summary>
    [Fact]
    public async Task WebProxyDown_502NamesTheProxy_NotTheUpstream()
    {
        await using var upstream = await TestUpstream.StartAsync("up");
        var config = new TernConfig(engine).Route("all", "proxied", "{**any}").Cluster("proxied", [upstream], new JsonObject
        {
            ["HttpClient"] = new JsonObject { ["WebProxy"] = new JsonObject { ["Address"] = $"http://127.0.0.1:{FreePort.Next()}/" } },
        });

        var (status, body, _, _) = await SecondRequestAsync(config);

        Assert.Equal(HttpStatusCode.BadGateway, status);
        Assert.Equal("502 Bad Gateway: the cluster's HttpClient:WebProxy refused the connection (cluster 'proxied')\n", body);
    }

    [Fact]
    public async Task UpstreamUnreachable_Returns502PromptlyWithReason()
    {
        using var blackhole = new Blackhole();
        var config = new TernConfig(engine).Route("all", "dark", "{**any}").Cluster("dark", [$"http://127.0.0.1:{blackhole.Port}/"]);

        var (status, body, _, elapsed) = await SecondRequestAsync(config);

        Assert.Equal(HttpStatusCode.BadGateway, status);
        Assert.Equal("502 Bad Gateway: the upstream did not accept the connection within Tern:Forwarding:ConnectTimeout (cluster 'dark')\n", body);

        // The 800 ms connect timeout ended it: without it, the kernel would retransmit the SYN after
        // 1 s, 3 s, 7 s... for minutes. 3 s leaves room for a loaded machine (1 s left 200 ms).
        Assert.True(elapsed < TimeSpan.FromSeconds(3), $"took {elapsed}");
    }

    /// <summary>
    /// A cluster's own Tern.ConnectTimeout (nginx's proxy_connect_timeout for one upstream, say
    /// one across a lossy network) replaces Tern:Forwarding:ConnectTimeout for its destinations,
    /// and the 502 names it.
    /// </summary>
    [Fact]
    public async Task UpstreamUnreachable_ClustersOwnConnectTimeout_IsWaitedFor_AndNamed()
    {
        using var blackhole = new Blackhole();
        var metadata = new JsonObject { ["Metadata"] = new JsonObject { ["Tern.ConnectTimeout"] = "00:00:02" } };
        var config = new TernConfig(engine).Route("all", "dark", "{**any}").Cluster("dark", [$"http://127.0.0.1:{blackhole.Port}/"], metadata);

        var (status, body, _, elapsed) = await SecondRequestAsync(config);

        Assert.Equal(HttpStatusCode.BadGateway, status);
        Assert.Equal("502 Bad Gateway: the upstream did not accept the connection within the cluster's Metadata:Tern.ConnectTimeout (cluster 'dark')\n", body);
        Assert.True(elapsed >= TimeSpan.FromSeconds(1.9), $"took {elapsed}: the 800 ms default, not the cluster's 2 s");
    }

    /// <summary>
    /// Set by a reload, a cluster's Tern.ConnectTimeout applies to the next request (a new client
    /// for the cluster); taken out by the next reload, Tern's own applies again.
    /// </summary>
    [Fact]
    public async Task ClustersOwnConnectTimeout_SetAndRemovedByReloads_AppliesToTheNextRequest()
    {
        using var blackhole = new Blackhole();
        var config = new TernConfig(engine).Route("all", "dark", "{**any}").Cluster("dark", [$"http://127.0.0.1:{blackhole.Port}/"]);
        await using var tern = await TernInstance.StartAsync(config);
        using var client = tern.CreateClient();
        const string Ours = "502 Bad Gateway: the upstream did not accept the connection within the cluster's Metadata:Tern.ConnectTimeout (cluster 'dark')\n";
        const string Terns = "502 Bad Gateway: the upstream did not accept the connection within Tern:Forwarding:ConnectTimeout (cluster 'dark')\n";
        async Task<string> BadGatewayAsync()
        {
            using var response = await client.GetAsync(new Uri("/anything", UriKind.Relative));
            Assert.Equal(HttpStatusCode.BadGateway, response.StatusCode);
            return await response.Content.ReadAsStringAsync();
        }

        Assert.Equal(Terns, await BadGatewayAsync());

        var cluster = (JsonObject)config.ReverseProxy["Clusters"]!["dark"]!;
        cluster["Metadata"] = new JsonObject { ["Tern.ConnectTimeout"] = "00:00:02" };
        var logged = tern.Logs.Count;
        await tern.RewriteConfigAsync(config.ToJson());
        await tern.Logs.WaitForAsync("Configuration reloaded", after: logged);
        var watch = Stopwatch.StartNew();
        Assert.Equal(Ours, await BadGatewayAsync());
        Assert.True(watch.Elapsed >= TimeSpan.FromSeconds(1.9), $"took {watch.Elapsed}: the 800 ms default, not the cluster's 2 s");

        cluster.Remove("Metadata");
        logged = tern.Logs.Count;
        await tern.RewriteConfigAsync(config.ToJson());
        await tern.Logs.WaitForAsync("Configuration reloaded", after: logged);
        watch.Restart();
        Assert.Equal(Terns, await BadGatewayAsync());
        Assert.True(watch.Elapsed < TimeSpan.FromSeconds(1.9), $"took {watch.Elapsed}: still the cluster's 2 s");
    }

    /// <summary>A loopback listener whose accept queue is full: it drops further SYNs, like a host that never answers.</summary>
    private sealed class Blackhole : IDisposable
    {
        private readonly System.Net.Sockets.Socket _listener = new(System.Net.Sockets.AddressFamily.InterNetwork, System.Net.Sockets.SocketType.Stream, System.Net.Sockets.ProtocolType.Tcp);
        private readonly List<System.Net.Sockets.Socket> _fillers = [];

        public Blackhole()
        {
            _listener.Bind(new IPEndPoint(IPAddress.Loopback, 0));
            _listener.Listen(0);
            for (var i = 0; i < 4; i++)
            {
                var filler = new System.Net.Sockets.Socket(System.Net.Sockets.AddressFamily.InterNetwork, System.Net.Sockets.SocketType.Stream, System.Net.Sockets.ProtocolType.Tcp) { Blocking = false };
                try
                {
                    filler.Connect(_listener.LocalEndPoint!);
                }
                catch (System.Net.Sockets.SocketException)
                {
                }

                _fillers.Add(filler);
            }
        }

        public int Port => ((IPEndPoint)_listener.LocalEndPoint!).Port;

        public void Dispose()
        {
            _fillers.ForEach(f => f.Dispose());
            _listener.Dispose();
        }
    }

    /// <summary>
    /// Starts a Tern on <paramref name="config"/> and times its answer to a second request: the
    /// first, which must also be a 502, pays for the client's TLS handshake and a cold process (on a
    /// busy CI machine a cold first request came within 60 ms of a 1 s bound), and the bounds above
    /// are about the proxy's answer.
    /// </summary>
    private static async Task<(HttpStatusCode Status, string Body, string? ContentType, TimeSpan Elapsed)> SecondRequestAsync(TernConfig config)
    {
        await using var tern = await TernInstance.StartAsync(config);
        using var client = tern.CreateClient();
        using var first = await client.GetAsync(new Uri("/anything", UriKind.Relative));
        Assert.Equal(HttpStatusCode.BadGateway, first.StatusCode);

        var watch = Stopwatch.StartNew();
        using var response = await client.GetAsync(new Uri("/anything", UriKind.Relative));
        watch.Stop();
        return (response.StatusCode, await response.Content.ReadAsStringAsync(), response.Content.Headers.ContentType?.ToString(), watch.Elapsed);
    }

    [Fact]
    public async Task Headers_RouteWithOwnXForwardedAppend_StillDropsUntrustedClaims()
    {
        using var client = _tern.CreateClient();
        using var request = new HttpRequestMessage(HttpMethod.Get, new Uri("/append/headers", UriKind.Relative));
        request.Headers.Add("X-Forwarded-For", "6.6.6.6");
        request.Headers.Add("X-Forwarded-Proto", "gopher");
        request.Headers.Add("Forwarded", "for=6.6.6.6");

        using var response = await client.SendAsync(request);
        var headers = TestUpstream.ParseHeaders(await response.Content.ReadAsStringAsync());

        // The route's own transform formats the address its way; what matters is that the claim is gone.
        Assert.EndsWith("127.0.0.1", headers["X-Forwarded-For"], StringComparison.Ordinal);
        Assert.DoesNotContain("6.6.6.6", headers["X-Forwarded-For"], StringComparison.Ordinal);
        Assert.Equal("https", headers["X-Forwarded-Proto"]);
        Assert.False(headers.ContainsKey("Forwarded"));
    }

    [Fact]
    public async Task SlowUpstream_Returns504AfterClusterActivityTimeout()
    {
        var config = TernConfig.To(engine, _upstream);
        ((JsonObject)config.ReverseProxy["Clusters"]!["app"]!)["HttpRequest"] = new JsonObject { ["ActivityTimeout"] = "00:00:01" };
        await using var tern = await TernInstance.StartAsync(config);
        using var client = tern.CreateClient();

        // The first request pays for the client's TLS handshake and a cold proxy; the bounds are
        // about the activity timeout, so they are timed on the second.
        Assert.Equal("up", await client.GetStringAsync(new Uri("/name", UriKind.Relative)));

        var watch = Stopwatch.StartNew();
        using var response = await client.GetAsync(new Uri("/slow/5000", UriKind.Relative));
        watch.Stop();

        Assert.Equal(HttpStatusCode.GatewayTimeout, response.StatusCode);
        Assert.Contains("did not respond in time", await response.Content.ReadAsStringAsync(), StringComparison.Ordinal);

        // Below the upstream's 5 s: the proxy gave up after its 1 s timeout, the upstream never answered.
        Assert.InRange(watch.Elapsed, TimeSpan.FromSeconds(0.9), TimeSpan.FromSeconds(4.9));
    }

    /// <summary>
    /// A route's Timeout (YARP's, for the whole request): a response not begun within it is a 504
    /// naming it, one begun is cut so that the client cannot take it for whole, a request body
    /// still coming is the client's 408, and a quicker request passes. Before ASP.NET Core's request timeouts were added, every request of such a route
    /// was a 500.
    /// </summary>
    [Fact]
    public async Task SlowUpstream_RoutesTimeout_504BeforeTheResponse_CutAfter()
    {
        var config = new TernConfig(engine).Route("all", "app", "{**catch-all}", new JsonObject { ["Timeout"] = "00:00:01" }).Cluster("app", [_upstream]);
        await using var tern = await TernInstance.StartAsync(config);
        using var client = tern.CreateClient();
        Assert.Equal("up", await client.GetStringAsync(new Uri("/name", UriKind.Relative)));

        var watch = Stopwatch.StartNew();
        using (var response = await client.GetAsync(new Uri("/slow/5000", UriKind.Relative)))
        {
            watch.Stop();
            Assert.Equal(HttpStatusCode.GatewayTimeout, response.StatusCode);
            Assert.Equal("504 Gateway Timeout: the upstream of cluster 'app' did not complete the response within the route's Timeout\n", await response.Content.ReadAsStringAsync());
            Assert.InRange(watch.Elapsed, TimeSpan.FromSeconds(0.9), TimeSpan.FromSeconds(4.9)); // the route's 1 s, not the upstream's 5 s
        }

        await tern.Logs.WaitForAsync("GET /slow/5000 returned 504: the upstream of cluster 'app' did not complete the response within the route's Timeout (route all, cluster app, destination d1)");

        // 10 chunks a 300 ms apart: begun, then cut at 1 s.
        using (var response = await client.GetAsync(new Uri("/stream/10/300", UriKind.Relative), HttpCompletionOption.ResponseHeadersRead))
        {
            Assert.Equal(HttpStatusCode.OK, response.StatusCode);
            await Assert.ThrowsAnyAsync<Exception>(() => response.Content.ReadAsByteArrayAsync());
        }

        await tern.Logs.WaitForAsync("GET /stream/10/300 was cut short after its 200 response began: the upstream of cluster 'app' did not complete the response within the route's Timeout (route all, cluster app, destination d1): route Timeout 00:00:01");

        // A body still being sent when the Timeout runs out: the client's side, 408, and the
        // connection closed (the rest of the body cannot be framed).
        await using (var raw = await RawHttp.ConnectAsync(tern.Config.HttpsPort))
        {
            using var timeout = new CancellationTokenSource(TimeSpan.FromSeconds(10));
            await raw.WriteAsync("POST /echo HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n", timeout.Token);
            var answer = await raw.ReadUntilAsync("\r\n0\r\n\r\n", timeout.Token); // the chunked answer's end
            Assert.StartsWith("HTTP/1.1 408 Request Timeout\r\nConnection: close\r\n", answer, StringComparison.Ordinal);
            Assert.Contains("408 Request Timeout: the client did not finish sending the request body within the route's Timeout", answer, StringComparison.Ordinal);
        }

        await tern.Logs.WaitForAsync("POST /echo returned 408: the client did not finish sending the request body within the route's Timeout (route all, cluster app, destination d1): route Timeout 00:00:01");
    }

    [Fact]
    public async Task NoRouteMatches_Returns404WithReason()
    {
        var config = new TernConfig(engine).Route("only", "app", "/only/{**rest}").Cluster("app", [_upstream]);
        await using var tern = await TernInstance.StartAsync(config);
        using var client = tern.CreateClient();

        using var response = await client.GetAsync(new Uri("/elsewhere", UriKind.Relative));

        Assert.Equal(HttpStatusCode.NotFound, response.StatusCode);
        Assert.Contains("no route matches", await response.Content.ReadAsStringAsync(), StringComparison.Ordinal);
    }

    /// <summary>A stream that hides its length, so HttpClient must send the body chunked.</summary>
    private sealed class UnknownLengthStream(byte[] data) : MemoryStream(data)
    {
        public override bool CanSeek => false;

        public override int Read(byte[] buffer, int offset, int count) => base.Read(buffer, offset, Math.Min(count, 7919));

        public override Task<int> ReadAsync(byte[] buffer, int offset, int count, CancellationToken cancellationToken) =>
            base.ReadAsync(buffer, offset, Math.Min(count, 7919), cancellationToken);

        public override ValueTask<int> ReadAsync(Memory<byte> buffer, CancellationToken cancellationToken = default) =>
            base.ReadAsync(buffer[..Math.Min(buffer.Length, 7919)], cancellationToken);
    }
}

public sealed class OpenSslForwardingTests() : ForwardingTests(Proxy.Tls.TlsEngines.OpenSsl);

public sealed class SslStreamForwardingTests() : ForwardingTests(Proxy.Tls.TlsEngines.SslStream);
