using System.Collections.Concurrent;
using System.Net;
using System.Net.Sockets;
using System.Text;
using System.Text.Json.Nodes;
using System.Text.RegularExpressions;
using Tern.Tests.Infrastructure;

namespace Tern.Tests.Forwarding;

/// <summary>
/// Request smuggling: requests whose framing or headers a server behind Tern could read otherwise
/// than Tern does. Each is sent over real TLS to a real Tern in front of an upstream that parses
/// HTTP/1.1 strictly and records every request it gets. Whatever Kestrel accepts, the upstream must
/// see requests framed one way only (never both Content-Length and Transfer-Encoding, never a line
/// that is not CRLF-ended), never a request the client hid in another's body, and never a header the
/// client injected through a line break.
/// </summary>
/// <remarks>
/// Parsing and re-framing are Kestrel's and YARP's, the same under either TLS engine, so this runs
/// on the default engine only.
/// </remarks>
public sealed class SmugglingTests : IAsyncLifetime
{
    private const string Smuggled = "GET /smuggled HTTP/1.1\r\nHost: localhost\r\n\r\n";

    private readonly RecordingUpstream _upstream = new();
    private readonly RawUpstream _responder = new(AnswerAsync);
    private TernInstance _tern = null!;

    public async Task InitializeAsync()
    {
        _tern = await TernInstance.StartAsync(new TernConfig(Proxy.Tls.TlsEngines.OpenSsl)
            .Route("all", "app", "{**catch-all}").Cluster("app", [_upstream.Address])
            .Route("responses", "responses", "/r/{**rest}").Cluster("responses", [_responder.Address])
            .Route("stripped", "app", "/strip/{**rest}", new JsonObject { ["Transforms"] = new JsonArray(new JsonObject { ["PathRemovePrefix"] = "/strip" }) })
            .Route("set", "app", "/set/{**rest}", new JsonObject { ["Transforms"] = new JsonArray(new JsonObject { ["PathSet"] = "/fixed" }) })
            .Route("prefixed", "app", "/pre/{**rest}", new JsonObject { ["Transforms"] = new JsonArray(new JsonObject { ["PathPrefix"] = "/v2/" }) })
            .Route("moved", "app", "/moved/{**rest}", new JsonObject { ["Transforms"] = new JsonArray(new JsonObject { ["PathRemovePrefix"] = "/moved" }, new JsonObject { ["PathPrefix"] = "/v2" }) })
            .Route("slashed", "app", "/slashed/{**rest}", new JsonObject { ["Transforms"] = new JsonArray(new JsonObject { ["PathRemovePrefix"] = "/slashed" }, new JsonObject { ["PathPrefix"] = "/v2/" }) })
            .Route("slashes", "app", "/slashes/{**rest}", new JsonObject { ["Transforms"] = new JsonArray(new JsonObject { ["PathPrefix"] = "//" }) })
            .Route("bracketed", "app", "/bracketed/{**rest}", new JsonObject { ["Transforms"] = new JsonArray(new JsonObject { ["PathPrefix"] = "/v[2]" }) })
            .Route("swapped", "app", "/swap/{**rest}", new JsonObject { ["Transforms"] = new JsonArray(new JsonObject { ["PathPattern"] = "/v2/{**rest}" }) })
            .Route("patterned", "app", "/item/{id}/{**rest}", new JsonObject { ["Transforms"] = new JsonArray(new JsonObject { ["PathPattern"] = "/items/{id}/{**rest}" }) })
            .Route("reordered", "app", "/api/{service}/{version}/{**rest}", new JsonObject { ["Transforms"] = new JsonArray(new JsonObject { ["PathPattern"] = "/{version}/svc/{service}/{**rest}" }, new JsonObject { ["QueryRemoveParameter"] = "drop" }) })
            .Route("defaulted", "app", "/def/{version=v1}/{**rest}", new JsonObject { ["Transforms"] = new JsonArray(new JsonObject { ["PathPattern"] = "/d/{version}/{**rest}" }) })
            .Route("literal", "app", "/lit/{**rest}", new JsonObject { ["Transforms"] = new JsonArray(new JsonObject { ["PathPattern"] = "/C++ caf\u00e9/v1:beta/{**rest}" }) })
            .Route("tilde", "app", "/tld/{id}/{**rest}", new JsonObject { ["Transforms"] = new JsonArray(new JsonObject { ["PathPattern"] = "~/{id}/{**rest}" }) })
            .Route("dotted", "app", "/dot/{id}/{**rest}", new JsonObject { ["Transforms"] = new JsonArray(new JsonObject { ["PathPattern"] = "/p/{id}/../{**rest}" }) })
            .Route("rooted", "app", "/rt/{**rest}", new JsonObject { ["Transforms"] = new JsonArray(new JsonObject { ["PathPattern"] = "/{**rest}" }) })
            .Route("complex", "app", "/cx/{name}.{ext}", new JsonObject { ["Transforms"] = new JsonArray(new JsonObject { ["PathPattern"] = "/files/{name}/{ext}" }) })
            .Route("twice", "app", "/twice/{**rest}", new JsonObject { ["Transforms"] = new JsonArray(new JsonObject { ["PathPrefix"] = "/a" }, new JsonObject { ["PathPrefix"] = "/b" }) })
            .Route("query", "app", "/query/{**rest}", new JsonObject { ["Transforms"] = new JsonArray(new JsonObject { ["QueryValueParameter"] = "added", ["Set"] = "a b" }) })
            .Route("strippedquery", "app", "/stripq/{**rest}", new JsonObject { ["Transforms"] = new JsonArray(new JsonObject { ["PathRemovePrefix"] = "/stripq" }, new JsonObject { ["QueryRemoveParameter"] = "drop" }) }));
    }

    public async Task DisposeAsync()
    {
        await _tern.DisposeAsync();
        _upstream.Dispose();
        _responder.Dispose();
    }

    /// <summary>
    /// HTTP/1.1 requests and what must come of each: the statuses the client reads, and the one
    /// request the upstream gets, as its path and body ("" for none).
    /// </summary>
    public static TheoryData<string, string, string, string> Http1Requests() => new()
    {
        // Both framings (RFC 9112, 6.1): chunked wins and the connection closes after the answer.
        { "CL.TE", "POST /a HTTP/1.1\r\nHost: localhost\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + Smuggled, "200", "/a " },
        { "TE.CL", "POST /a HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n8\r\nSMUGGLED\r\n0\r\n\r\n", "200", "/a SMUGGLED" },
        { "two Content-Lengths", "POST /a HTTP/1.1\r\nHost: localhost\r\nContent-Length: 3\r\nContent-Length: 5\r\n\r\nabcde", "400", "" },
        { "chunked not last", "POST /a HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n" + Smuggled, "400", "" },
        { "unknown coding", "POST /a HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n" + Smuggled, "400", "" },
        { "space before colon", "POST /a HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n" + Smuggled, "400", "" },
        { "folded header", "GET /a HTTP/1.1\r\nHost: localhost\r\nX-A: b\r\n Transfer-Encoding: chunked\r\n\r\n", "400", "" },
        { "bare CR in a value", "GET /a HTTP/1.1\r\nHost: localhost\r\nX-A: b\rX-Injected: 1\r\n\r\n", "400", "" },
        { "NUL in a value", "GET /a HTTP/1.1\r\nHost: localhost\r\nX-A: b\0c\r\n\r\n", "400", "" },
        { "two Hosts", "GET /a HTTP/1.1\r\nHost: localhost\r\nHost: evil\r\n\r\n", "400", "" },
        { "absolute form naming another host", "GET http://evil/a HTTP/1.1\r\nHost: localhost\r\n\r\n", "400", "" },
        { "chunk size of 2^31", "POST /a HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n80000000\r\nabc\r\n", "400", "" },
        { "bare LF in a chunk extension", "POST /a HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n3;x\nabc\r\n0\r\n\r\n" + Smuggled, "400", "" },
        { "framing in a trailer", "POST /a HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nContent-Length: 40\r\nTransfer-Encoding: chunked\r\n\r\n", "200", "/a abc" },
        // Codings Kestrel passes over (it decodes the last, chunked): refused, and the connection closed.
        { "a coding before chunked", "POST /a HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n" + Smuggled, "501", "" },
        { "codings on two lines", "POST /a HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n" + Smuggled, "400", "" },
        { "an empty line before chunked", "POST /a HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: \r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n" + Smuggled, "400", "" },
        { "a vertical tab as a coding", "POST /a HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: \v, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n" + Smuggled, "501", "" },
        { "chunked twice", "POST /a HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n" + Smuggled, "501", "" },
        { "HTTP/1.0 chunked", "POST /a HTTP/1.0\r\nHost: localhost\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + Smuggled, "400", "" },
        { "chunked in capitals", "POST /a HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: Chunked \r\n\r\n5\r\nhello\r\n0\r\n\r\n", "200", "/a hello" },
        { "an empty list element", "POST /a HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked, \r\n\r\n5\r\nhello\r\n0\r\n\r\n", "200", "/a hello" }, // RFC 9110, 5.6.1
        // YARP forwards WebSocket upgrades only; an h2c upgrade must not reach the upstream.
        { "h2c upgrade", "GET /a HTTP/1.1\r\nHost: localhost\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\nConnection: Upgrade, HTTP2-Settings\r\n\r\n", "200", "/a " },
    };

    [Theory]
    [MemberData(nameof(Http1Requests))]
    public async Task Http1_EveryRequestReachesTheUpstreamFramedOneWay(string name, string request, string statuses, string forwarded)
    {
        _ = name;
        _upstream.Clear();
        await using var client = await RawHttp.ConnectAsync(_tern.Config.HttpsPort);
        await client.WriteAsync(request);
        var received = await ReadUntilQuietAsync(client.Stream);
        await Task.Delay(200); // a request that reached the upstream is recorded by then (it was answered)

        var seen = string.Join(",", Regex.Matches(received, @"(?m)^HTTP/1\.1 (\d{3}) ").Select(m => m.Groups[1].Value));
        Assert.Equal(statuses, seen);
        Assert.Empty(_upstream.Violations);
        var requests = _upstream.Requests.ToList();
        Assert.DoesNotContain(requests, r => r.Target.Contains("smuggled", StringComparison.Ordinal));
        if (forwarded == "")
        {
            // A body refused part-way may have had its head forwarded, but never reaches the
            // upstream whole: Tern's HTTP client ends that upstream connection.
            Assert.Empty(requests);
            return;
        }

        var only = Assert.Single(requests);
        Assert.Equal(forwarded, only.Target + " " + only.Body);
        Assert.DoesNotContain(only.Headers, h => h.Name.Equals("Upgrade", StringComparison.OrdinalIgnoreCase) || h.Name.Equals("HTTP2-Settings", StringComparison.OrdinalIgnoreCase));
        Assert.Empty(only.Trailers);
    }

    /// <summary>
    /// HTTP/2 requests, which Tern forwards over HTTP/1.1: HPACK carries any byte in a name or
    /// value, so a CR or LF there would become a header line of its own, and a request's length is
    /// its DATA frames, whatever content-length says. Each must be refused (a stream reset or the
    /// connection's GOAWAY), or reach the upstream as one well-framed request.
    /// </summary>
    public static TheoryData<string, string[], string?, string> Http2Requests() => new()
    {
        { "CRLF in a value", ["x", "a\r\nTransfer-Encoding: chunked"], null, "refused" },
        { "LF in a value", ["x", "a\nX-Injected: 1"], null, "refused" },
        { "NUL in a value", ["x", "a\0b"], null, "refused" },
        { "CRLF in a name", ["x\r\nx-injected", "1"], null, "200 /a " },
        { "upper-case name", ["X-Up", "1"], null, "refused" },
        { "CRLF in :path", [":path", "/a HTTP/1.1\r\nHost: localhost\r\n\r\nGET /smuggled"], null, "refused" },
        { "CRLF in :method", [":method", "GET /smuggled HTTP/1.1\r\nX:"], null, "refused" },
        { "CRLF in :authority", [":authority", "localhost\r\nX-Injected: 1"], null, "refused" },
        { "connection header", ["connection", "keep-alive"], null, "refused" },
        { "te other than trailers", ["te", "gzip"], null, "refused" },
        { "host unlike :authority", ["host", "evil"], null, "200 /a " },
        // Hop-by-hop headers RFC 9113 forbids that Kestrel lets through: dropped before forwarding.
        { "keep-alive header", ["keep-alive", "timeout=5"], null, "200 /a " },
        { "transfer-encoding header", ["transfer-encoding", "gzip, chunked"], null, "200 /a " }, // HTTP/2 frames the body itself
        { "proxy-connection header", ["proxy-connection", "keep-alive"], null, "200 /a " },
        { "upgrade header", ["upgrade", "websocket"], null, "200 /a " },
        { "transfer-encoding header", ["transfer-encoding", "chunked"], "0\r\n\r\n" + Smuggled, "200 /a 0\r\n\r\n" + Smuggled },
        { "content-length under the data", ["content-length", "3"], "abc" + Smuggled, "refused" },
        { "content-length over the data", ["content-length", "50"], "abc", "refused" },
    };

    [Theory]
    [MemberData(nameof(Http2Requests))]
    public async Task Http2_NoHeaderOrFramingCrossesIntoTheUpstreamsHttp11(string name, string[] header, string? body, string outcome)
    {
        _ = name;
        _upstream.Clear();
        var headers = new List<(string, string)> { (":method", body is null ? "GET" : "POST"), (":scheme", "https"), (":authority", "localhost"), (":path", "/a") };
        var replaced = headers.FindIndex(h => h.Item1 == header[0]);
        if (replaced >= 0)
        {
            headers[replaced] = (header[0], header[1]);
        }
        else
        {
            headers.Add((header[0], header[1]));
        }

        await using var client = await RawHttp.ConnectAsync(_tern.Config.HttpsPort, http2: true);
        var answer = await Http2Exchange(client.Stream, headers, body is null ? null : Encoding.Latin1.GetBytes(body));
        await Task.Delay(200);

        Assert.Empty(_upstream.Violations);
        var requests = _upstream.Requests.ToList();
        Assert.DoesNotContain(requests, r => r.Target.Contains("smuggled", StringComparison.Ordinal) || r.Headers.Any(h => h.Name.Contains("injected", StringComparison.OrdinalIgnoreCase)));
        if (outcome == "refused")
        {
            Assert.Equal("refused", answer);
            Assert.Empty(requests);
            return;
        }

        Assert.Equal("200", answer);
        var only = Assert.Single(requests);
        Assert.Equal(outcome, "200 " + only.Target + " " + only.Body);
        Assert.Equal("localhost", Assert.Single(only.Headers, h => h.Name.Equals("Host", StringComparison.OrdinalIgnoreCase)).Value);
        Assert.DoesNotContain(only.Headers, h => h.Name.ToLowerInvariant() is "connection" or "keep-alive" or "proxy-connection" or "upgrade");
    }

    /// <summary>
    /// An upstream that sends more than its response says it holds (a second response hidden after
    /// the first, or framing both ways) must not have the rest read as the answer to a later request
    /// on the same pooled connection (response queue poisoning).
    /// </summary>
    [Theory]
    [InlineData("/r/extra", "ok")] // Content-Length: 2, then a whole second response in the same write
    [InlineData("/r/both", "ok")] // Content-Length and chunked: read as chunked, the rest after it
    public async Task Response_BytesBeyondItsEnd_NeverAnswerTheNextRequest(string path, string body)
    {
        using var client = _tern.CreateClient();
        Assert.Equal(body, await client.GetStringAsync(path));
        for (var i = 0; i < 3; i++)
        {
            Assert.Equal("next", await client.GetStringAsync("/r/next"));
        }
    }

    /// <summary>A CR, NUL or folded line in an upstream's header never splits it into a header line of the client's response.</summary>
    [Theory]
    [InlineData("/r/cr")]
    [InlineData("/r/nul")]
    [InlineData("/r/fold")]
    [InlineData("/r/lf")]
    public async Task Response_HeaderWithALineBreakInside_ReachesTheClientAsOneLine(string path)
    {
        await using var client = await RawHttp.ConnectAsync(_tern.Config.HttpsPort);
        await client.WriteAsync($"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        var response = await client.ReadUntilAsync("\0");
        var head = response[..response.IndexOf("\r\n\r\n", StringComparison.Ordinal)];

        Assert.StartsWith("HTTP/1.1 200 ", head, StringComparison.Ordinal);
        Assert.DoesNotContain('\0', head);
        Assert.Equal(head.Split("\r\n").Length - 1, head.Count(c => c == '\r')); // every CR ends a line
        Assert.Equal(head.Split("\r\n").Length - 1, head.Count(c => c == '\n')); // and so does every LF
        var lines = head.Split("\r\n");
        if (path == "/r/lf")
        {
            // A bare LF ends a line for .NET's parser (RFC 9112 lets a recipient read it so): the
            // upstream's own header, which it could have sent anyway, not one made from a value.
            Assert.Contains(lines, l => l.StartsWith("Set-Cookie: evil=1", StringComparison.OrdinalIgnoreCase));
        }
        else
        {
            Assert.DoesNotContain(lines, l => l.StartsWith("Set-Cookie", StringComparison.OrdinalIgnoreCase));
            Assert.Contains(lines, l => l.StartsWith("X-A: b", StringComparison.Ordinal));
        }
    }

    /// <summary>
    /// Octets 0x80-0xFF in a header value (RFC 9110's obs-text: UTF-8 from a browser, Latin-1 from
    /// an old client) are opaque data a proxy passes on unchanged, as nginx does. Before, Tern
    /// answered 400 to bytes that were not UTF-8, reset the HTTP/2 stream, and answered 502 to the
    /// rest (.NET's client refused to send them).
    /// </summary>
    [Theory]
    [InlineData(false)]
    [InlineData(true)]
    public async Task Request_HeaderBytesAbove0x7F_ReachTheUpstreamUnchanged(bool http2)
    {
        const string Value = "caf\u00c3\u00a9 \u00e9t\u00e9 \u0080\u00ff"; // UTF-8 café, Latin-1 été, the extremes
        _upstream.Clear();
        await using var client = await RawHttp.ConnectAsync(_tern.Config.HttpsPort, http2: http2);
        if (http2)
        {
            Assert.Equal("200", await Http2Exchange(client.Stream, [(":method", "GET"), (":scheme", "https"), (":authority", "localhost"), (":path", "/a"), ("x-a", Value)], null));
        }
        else
        {
            await client.WriteAsync(Encoding.Latin1.GetBytes($"GET /a HTTP/1.1\r\nHost: localhost\r\nX-A: {Value}\r\nConnection: close\r\n\r\n"));
            var answer = await client.ReadUntilAsync("\0");
            Assert.True(answer.StartsWith("HTTP/1.1 200 ", StringComparison.Ordinal), answer);
        }

        var only = Assert.Single(_upstream.Requests);
        Assert.Equal(Value, Assert.Single(only.Headers, h => h.Name.Equals("X-A", StringComparison.OrdinalIgnoreCase)).Value);
        Assert.Empty(_upstream.Violations);
    }

    /// <summary>The same octets in an upstream's response header reach the client unchanged (before: a 502, Kestrel refused to write them).</summary>
    [Theory]
    [InlineData("1.1")]
    [InlineData("2.0")]
    public async Task Response_HeaderBytesAbove0x7F_ReachTheClientUnchanged(string version)
    {
        using var client = _tern.CreateClient(version: Version.Parse(version));
        using var response = await client.GetAsync("/r/bytes");

        Assert.Equal(HttpStatusCode.OK, response.StatusCode);
        Assert.Equal(new Version(version), response.Version);
        // .NET's client reads response headers as Latin-1 (one character per byte).
        Assert.Equal(ResponseBytes, Assert.Single(response.Content.Headers.GetValues("Content-Disposition")));
    }

    /// <summary>
    /// The upstream gets the path and query as the client wrote them (ClientTarget), as through
    /// nginx: before, <c>%2F</c> arrived as <c>%252F</c> and <c>%3B</c> as <c>;</c>. Where Kestrel
    /// resolved dot segments before routing, or the target holds what a URI may not, the upstream
    /// gets the path Tern routed on, as YARP writes it; so does a route that rewrites the path other
    /// than by removing a prefix, adding one, or both, or a PathPattern it can fill with the client's
    /// segments (RawPattern). A route's Query* transforms change the query alone (before, such a
    /// route sent YARP's path: <c>%2F</c> as <c>%252F</c>).
    /// </summary>
    [Theory]
    [InlineData("/a%2Fb", "/a%2Fb")]
    [InlineData("/a%3Bb%26c%3Dd%2Be", "/a%3Bb%26c%3Dd%2Be")]
    [InlineData("/caf%c3%a9/A%7eb", "/caf%c3%a9/A%7eb")]
    [InlineData("/a;v=1//b/...c", "/a;v=1//b/...c")]
    [InlineData("/q?x=%2F&y=a+b&z=%zz", "/q?x=%2F&y=a+b&z=%zz")]
    [InlineData("/a/%2e%2E/b%2F", "/b%252F")] // a dot segment: Kestrel's path, escaped by YARP
    [InlineData("/a/./b", "/a/b")]
    [InlineData("/q?x=<>", "/q?x=%3C%3E")] // not URI characters: YARP's escaping
    [InlineData("/strip/a%2Fb", "/a%2Fb")] // a route that removes a prefix: the rest as written
    [InlineData("/STRIP/a%3Bb?x=%2F", "/a%3Bb?x=%2F")] // the prefix in any case, as YARP removes it
    [InlineData("/strip?x=%2F", "/?x=%2F")]
    [InlineData("/str%69p/a%2Fb", "/a%252Fb")] // the prefix written with escapes: YARP's target
    [InlineData("/set/a%2Fb", "/fixed")] // a route that rewrites the path otherwise: YARP's target
    [InlineData("/pre/a%2Fb?x=%2F", "/v2/pre/a%2Fb?x=%2F")] // a route that adds a prefix: before the path as written
    [InlineData("/moved/a%2Fb", "/v2/a%2Fb")] // removes one, then adds one
    [InlineData("/pre/a/%2e%2E/b%2F", "/v2/pre/b%252F")] // a dot segment: Kestrel's path, escaped by YARP
    [InlineData("/moved", "/v2")] // as YARP: the prefix alone where nothing is left
    [InlineData("/moved?x=1", "/v2?x=1")]
    [InlineData("/twice/a%2Fb", "/b/a/twice/a%252Fb")] // two prefixes: YARP's target
    [InlineData("/swap/a%2Fb%3Bc?x=%2F", "/v2/a%2Fb%3Bc?x=%2F")] // a PathPattern that swaps one prefix for another: removes one, adds one
    [InlineData("/SWAP/a/b/", "/v2/a/b/")]
    [InlineData("/swap", "/v2")]
    [InlineData("/swap/", "/v2/")] // as the client wrote it (YARP sent /v2)
    [InlineData("/swap/a/%2e%2E/b%2F", "/v2/b%252F")] // a dot segment: Kestrel's path, escaped by YARP
    [InlineData("/item/a%2Fb/c%3Bd?x=%2F", "/items/a%2Fb/c%3Bd?x=%2F")] // a PathPattern filled with the client's segments (YARP: /items/a%252Fb/c;d)
    [InlineData("/ITEM/a%2Fb", "/items/a%2Fb")]
    [InlineData("/it%65m/a/", "/items/a/")] // the catch-all's '/' as the client wrote it (YARP: /items/a)
    [InlineData("/item/a/%2e%2E/b%2F", "/items/b%252F")] // a dot segment: Kestrel's path, escaped by YARP
    [InlineData("/api/search/v2/a%2Fb?drop=1&keep=a+b", "/v2/svc/search/a%2Fb?keep=a+b")] // its values in any order, with a Query* transform
    [InlineData("/def/v2/a%2Fb", "/d/v2/a%2Fb")]
    [InlineData("/def", "/d/v1")] // a value filled by a default: YARP's target
    [InlineData("/lit/a%2Fb", "/C++%20caf%C3%A9/v1:beta/a%2Fb")] // its literals as YARP writes them
    [InlineData("/tld/a%2Fb/x", "/~/a%2Fb/x")] // ~/ as YARP reads it in a PathPattern: the literal ~
    [InlineData("/dot/a%2Fb/x", "/p/x")] // a literal dot segment: YARP's target, resolved
    [InlineData("/rt/x%2F", "/x%2F")]
    [InlineData("/rt//x%2F", "/x%252F")] // a path that would start '//': YARP's target
    [InlineData("/cx/a%2Fb.txt", "/files/a%252Fb/txt")] // a value in a segment with others: YARP's target
    [InlineData("/slashed?x=1", "/v2/?x=1")] // the prefix whole where nothing is left, as YARP
    [InlineData("/slashed/a%2Fb", "/v2/a%2Fb")] // one '/' between
    [InlineData("/slashes/a%2Fb", "//slashes/a%2Fb")]
    [InlineData("/bracketed/a%2Fb", "/v%5B2%5D/bracketed/a%252Fb")] // a prefix YARP escapes: YARP's target
    [InlineData("/query/a%2Fb%3Bc?x=%2F", "/query/a%2Fb%3Bc?x=%2F&added=a%20b")] // a route's Query* transforms: the path as written, the query as they leave it
    [InlineData("/stripq/a%2Fb?drop=1&keep=%2F", "/a%2Fb?keep=%2F")]
    [InlineData("/query/x?a+b=c+d&%41=%7e&flag&a+b=2", "/query/x?a+b=c+d&%41=%7e&flag&a+b=2&added=a%20b")] // the query as written but for the transform's edit (YARP: ?a%20b=c%20d&a%20b=2&A=~&flag=&added=a%20b)
    [InlineData("/query/x?added=old&z=a+b&added=2", "/query/x?added=a%20b&z=a+b")] // Set: the new value where the name first stood
    [InlineData("/stripq/x?keep=a+b&drop=1&DROP=2&z", "/x?keep=a+b&z")]
    [InlineData("/stripq/x?keep=1;drop=1", "/x?keep=1;drop%3D1")] // a ';', which some upstreams split on: YARP's rebuilt query, where drop is no parameter
    [InlineData("/stripq/a%2Fb", "/a%2Fb")]
    [InlineData("/query/a/%2e%2e/b%2F", "/query/b%252F?added=a%20b")] // a dot segment: Kestrel's path, escaped by YARP
    public async Task Request_Target_ReachesTheUpstreamAsTheClientWroteIt(string target, string forwarded)
    {
        foreach (var http2 in new[] { false, true })
        {
            _upstream.Clear();
            var (status, answer) = await ExchangeAsync(http2, "GET", target);

            Assert.True(status == "200", answer ?? status);
            Assert.Equal(forwarded, Assert.Single(_upstream.Requests).Target);
            Assert.Empty(_upstream.Violations);
        }
    }

    /// <summary>
    /// Requests .NET's client cannot forward as the client wrote them, which Tern answers itself on
    /// both listeners and both protocols. CONNECT (but HTTP/2's extended CONNECT for a WebSocket):
    /// YARP failed each as a 502 that blamed the upstream, with a warning logged. OPTIONS *, a
    /// question about the server: the upstream got OPTIONS /, one about its root. Other OPTIONS are
    /// forwarded (over plain HTTP, redirected).
    /// </summary>
    [Theory]
    [InlineData("CONNECT localhost:443 HTTP/1.1\r\nHost: localhost:443", "405")] // Kestrel holds an authority to its Host
    [InlineData("CONNECT /a HTTP/1.1\r\nHost: localhost", "405")]
    [InlineData("OPTIONS * HTTP/1.1\r\nHost: localhost", "200")]
    [InlineData("OPTIONS https://localhost HTTP/1.1\r\nHost: localhost", "200")] // the last proxy sends it as * (RFC 9112, 3.2.4)
    [InlineData("OPTIONS https://localhost/ HTTP/1.1\r\nHost: localhost", "forwarded")]
    [InlineData("OPTIONS https://localhost?x=1 HTTP/1.1\r\nHost: localhost", "forwarded")]
    [InlineData("OPTIONS /a HTTP/1.1\r\nHost: localhost", "forwarded")]
    [InlineData("OPTIONS /a HTTP/1.1\r\nHost: localhost\r\nMax-Forwards: 0", "200")] // Tern the last recipient (RFC 9110, 7.6.2)
    [InlineData("OPTIONS /a HTTP/1.1\r\nHost: localhost\r\nMax-Forwards: 1", "forwarded")]
    [InlineData("OPTIONS /a HTTP/1.1\r\nHost: localhost\r\nMax-Forwards: -1", "400")]
    [InlineData("OPTIONS /a HTTP/1.1\r\nHost: localhost\r\nMax-Forwards: 1\r\nMax-Forwards: 2", "400")]
    [InlineData("OPTIONS /a HTTP/1.1\r\nHost: localhost\r\nMax-Forwards: 0\r\nMax-Forwards: 0", "200")] // lines alike are one
    [InlineData("GET /a HTTP/1.1\r\nHost: localhost\r\nMax-Forwards: 0", "forwarded")] // for OPTIONS and TRACE alone
    public async Task Http1_ConnectAndOptionsAsterisk_AnsweredByTern_NothingForwarded(string head, string status)
    {
        foreach (var (port, tls) in new[] { (_tern.Config.HttpsPort, true), (_tern.Config.HttpPort, false) })
        {
            _upstream.Clear();
            await using var client = await RawHttp.ConnectAsync(port, tls);
            await client.WriteAsync($"{head}\r\nConnection: close\r\n\r\n");
            var answer = await client.ReadUntilAsync("\0");

            var forwarded = status == "forwarded";
            Assert.True(answer.StartsWith($"HTTP/1.1 {(forwarded ? (tls ? "200" : "308") : status)} ", StringComparison.Ordinal), answer);
            Assert.Contains(status switch
            {
                "405" => "405 Method Not Allowed: Tern is a reverse proxy and does not tunnel CONNECT (HTTP/2's extended CONNECT, for WebSockets only)",
                "200" => "\r\nContent-Length: 0\r\n",
                "400" => "400 Bad Request: Max-Forwards must be one number, the hops the request may still be forwarded (RFC 9110, 7.6.2)",
                _ => "\r\n",
            }, answer, StringComparison.Ordinal);
            Assert.Equal(forwarded && tls ? 1 : 0, _upstream.Requests.Count);
        }

        Assert.DoesNotContain(_tern.Logs.Lines, l => l.Contains("Unsupported request method", StringComparison.Ordinal));
    }

    [Theory]
    [InlineData(":method=CONNECT :authority=localhost:443", "405")]
    [InlineData(":method=CONNECT :protocol=connect-udp :scheme=https :authority=localhost :path=/a", "405")] // RFC 9298, not a WebSocket
    [InlineData(":method=OPTIONS :scheme=https :authority=localhost :path=*", "200")]
    [InlineData(":method=OPTIONS :scheme=https :authority=localhost :path=/a", "forwarded")]
    [InlineData(":method=OPTIONS :scheme=https :authority=localhost :path=/a max-forwards=0", "200")]
    public async Task Http2_ConnectAndOptionsAsterisk_AnsweredByTern_NothingForwarded(string fields, string status)
    {
        _upstream.Clear();
        await using var client = await RawHttp.ConnectAsync(_tern.Config.HttpsPort, http2: true);
        var headers = fields.Split(' ').Select(f => (f[..f.IndexOf('=', 1)], f[(f.IndexOf('=', 1) + 1)..])).ToList();

        var forwarded = status == "forwarded";
        Assert.Equal(forwarded ? "200" : status, await Http2Exchange(client.Stream, headers, null));
        Assert.Equal(forwarded ? 1 : 0, _upstream.Requests.Count);
        Assert.DoesNotContain(_tern.Logs.Lines, l => l.Contains("Unsupported request method", StringComparison.Ordinal));
    }

    /// <summary>
    /// An OPTIONS with Max-Forwards above 0 goes on one lower, as each intermediary must count it
    /// down (RFC 9110, 7.6.2): before, the upstream got the client's value.
    /// </summary>
    [Theory]
    [InlineData("5", "4")]
    [InlineData("007", "6")]
    [InlineData("99999999999999999999", "2147483646")] // beyond any count of hops: as many as can be
    public async Task Options_MaxForwards_CountedDownOnTheWay(string sent, string forwarded)
    {
        _upstream.Clear();
        await using var client = await RawHttp.ConnectAsync(_tern.Config.HttpsPort, tls: true);
        await client.WriteAsync($"OPTIONS /a HTTP/1.1\r\nHost: localhost\r\nMax-Forwards: {sent}\r\nConnection: close\r\n\r\n");
        var answer = await client.ReadUntilAsync("\0");

        Assert.StartsWith("HTTP/1.1 200 ", answer, StringComparison.Ordinal);
        var request = Assert.Single(_upstream.Requests);
        Assert.Equal(forwarded, Assert.Single(request.Headers, h => h.Name.Equals("Max-Forwards", StringComparison.OrdinalIgnoreCase)).Value);
    }

    /// <summary>
    /// A body framed by codings Kestrel would pass over gets a 501 (nginx's answer) that says so,
    /// an HTTP/1.0 one framed by Transfer-Encoding a 400, on both listeners, and the connection
    /// ends with the answer (its body's end is in doubt).
    /// </summary>
    [Theory]
    [InlineData("1.1", "gzip, chunked", "501 Not Implemented: Tern decodes no transfer coding but chunked, and this request's Transfer-Encoding names another, or chunked twice")]
    [InlineData("1.0", "chunked", "400 Bad Request: an HTTP/1.0 request cannot be framed by Transfer-Encoding (RFC 9112, 6.1)")]
    public async Task Http1_TransferCodingKestrelWouldPassOver_RefusedWithTheReason_ConnectionClosed(string version, string codings, string answer)
    {
        foreach (var (port, tls) in new[] { (_tern.Config.HttpsPort, true), (_tern.Config.HttpPort, false) })
        {
            _upstream.Clear();
            await using var client = await RawHttp.ConnectAsync(port, tls);
            await client.WriteAsync($"POST /a HTTP/{version}\r\nHost: localhost\r\nConnection: keep-alive\r\nTransfer-Encoding: {codings}\r\n\r\n5\r\nhello\r\n0\r\n\r\n");
            var received = await client.ReadUntilAsync("\0"); // to the connection's end

            Assert.StartsWith($"HTTP/1.1 {answer[..3]} ", received, StringComparison.Ordinal);
            Assert.Contains("\r\nConnection: close\r\n", received, StringComparison.Ordinal);
            Assert.Contains(answer, received, StringComparison.Ordinal);
            Assert.Empty(_upstream.Requests);
        }
    }

    /// <summary>
    /// A field that takes one value, on two lines: Kestrel and .NET's client joined them, so two
    /// Authorization lines reached the upstream as 'Basic a, Bearer b', a credential the client
    /// never gave, while a server before Tern reads one of them. 400 naming the field, on both
    /// protocols, and nothing forwarded; one line with a comma, a list field on two lines, and
    /// lines that all say the same (sent as one), are forwarded.
    /// </summary>
    [Theory]
    [InlineData("authorization", "Basic YTpi", "Bearer x", "Authorization")]
    [InlineData("content-type", "text/plain", "application/json", "Content-Type")]
    [InlineData("range", "bytes=0-1", "bytes=5-9", "Range")]
    [InlineData("if-modified-since", "Thu, 26 Nov 2026 10:00:00 GMT", "Wed, 25 Nov 2026 10:00:00 GMT", "If-Modified-Since")]
    [InlineData("origin", "https://a.example", "https://b.example", "Origin")]
    [InlineData("accept", "text/html", "application/json", null)]
    [InlineData("content-type", "application/json", "application/json", null)] // the same on both lines: forwarded as one
    public async Task FieldThatTakesOneValue_OnTwoLines_400NamesIt_NothingForwarded(string name, string first, string second, string? refused)
    {
        foreach (var http2 in new[] { false, true })
        {
            _upstream.Clear();
            var (status, answer) = await ExchangeAsync(http2, "GET", "/a", (name, first), (name, second));
            if (answer is not null && refused is not null)
            {
                Assert.Contains($"400 Bad Request: the request has more than one {refused} header, a field that takes one value", answer, StringComparison.Ordinal);
            }

            Assert.Equal(refused is null ? "200" : "400", status);
            if (refused is null)
            {
                Assert.Equal(first == second ? first : $"{first}, {second}", Assert.Single(_upstream.Requests).Headers.Single(h => h.Name.Equals(name, StringComparison.OrdinalIgnoreCase)).Value);
            }
            else
            {
                Assert.Empty(_upstream.Requests);
            }
        }

        // One line is the client's own value.
        _upstream.Clear();
        await using var oneLine = await RawHttp.ConnectAsync(_tern.Config.HttpsPort);
        await oneLine.WriteAsync($"GET /a HTTP/1.1\r\nHost: localhost\r\n{name}: {first}, {second}\r\nConnection: close\r\n\r\n");
        Assert.StartsWith("HTTP/1.1 200 ", await oneLine.ReadUntilAsync("\0"), StringComparison.Ordinal);
    }

    /// <summary>
    /// Methods are case-sensitive (RFC 9110, 9.1), but .NET's client reads those it knows in any
    /// case and sends them in capitals: 'head' reached the upstream as HEAD, and Kestrel, for which
    /// 'head' is not HEAD, failed the bodiless answer as a 500. Such a method gets a 501 that names
    /// what would have been sent, on both protocols ('trace' and 'connect' the 405 of TRACE and
    /// CONNECT); one .NET does not know is forwarded as written.
    /// </summary>
    [Theory]
    [InlineData("head", "HEAD")]
    [InlineData("get", "GET")]
    [InlineData("Post", "POST")]
    [InlineData("patch", "PATCH")] // fetch() sends it so: only DELETE, GET, HEAD, OPTIONS, POST and PUT are put in capitals
    [InlineData("query", "QUERY")]
    [InlineData("trace", "405")] // refused as TRACE, which Tern never sends
    [InlineData("connect", "405")]
    [InlineData("propfind", null)]
    [InlineData("HEAD", null)]
    public async Task MethodDotNetWouldSendInCapitals_501NamesIt_OthersForwardedAsWritten(string method, string? sent)
    {
        var status = sent switch { null => "200", "405" => "405", _ => "501" };
        foreach (var http2 in new[] { false, true })
        {
            _upstream.Clear();
            var (answered, answer) = await ExchangeAsync(http2, method, "/a");
            if (answer is not null && status == "501")
            {
                Assert.Contains($"501 Not Implemented: the method '{method}' is not {sent} (methods are case-sensitive), and Tern's HTTP client would send it as {sent}", answer, StringComparison.Ordinal);
            }

            Assert.Equal(status, answered);
            Assert.Equal(sent is null ? [method] : [], _upstream.Requests.Select(r => r.Method));
        }

        Assert.DoesNotContain(_tern.Logs.Lines, l => l.StartsWith("Error:", StringComparison.Ordinal));
    }

    /// <summary>
    /// Over HTTP/2 a target may carry raw bytes above 0x7F (a client that sends UTF-8 unescaped,
    /// as curl does a query's): 400, as over HTTP/1.1, where Kestrel refuses them. Before, Kestrel
    /// read them one character a byte, routes matched on those characters, and YARP encoded each
    /// again as UTF-8: é (C3 A9) reached the upstream as %C3%83%C2%A9.
    /// </summary>
    [Theory]
    [InlineData("/q?x=\u00c3\u00a9")]
    [InlineData("/\u00c3\u00a9/b")]
    [InlineData("/strip/\u00c3\u00a9")]
    public async Task Http2_RawBytesAbove0x7FInTheTarget_400AndNothingForwarded(string target)
    {
        _upstream.Clear();
        await using var client = await RawHttp.ConnectAsync(_tern.Config.HttpsPort, http2: true);

        Assert.Equal("400", await Http2Exchange(client.Stream, [(":method", "GET"), (":scheme", "https"), (":authority", "localhost"), (":path", target)], null));
        Assert.Empty(_upstream.Requests);
    }

    /// <summary>
    /// A '..' segment an upstream could resolve to a path Tern did not route. In an absolute URL
    /// Kestrel resolves dot segments before it decodes %2F, so
    /// <c>https://localhost/strip%2F..%2Fadmin</c> was routed as <c>/strip/../admin</c> (route
    /// 'stripped') and .NET's client resolved it: the upstream got <c>/admin</c>. In any target, one
    /// beside a %2F Kestrel keeps, a backslash (IIS's '/') or before a ';' (Tomcat's path
    /// parameters: <c>/strip/..;/admin</c>) reached the upstream as written. 400, and nothing
    /// forwarded; a path without one is served, and one whose dot segments Kestrel resolved is
    /// routed where they lead.
    /// </summary>
    [Theory]
    [InlineData("https://localhost/strip%2F..%2Fadmin", null)]
    [InlineData("https://localhost/strip/%2e%2e%2Fadmin", null)]
    [InlineData("/strip/..%2Fadmin", null)]
    [InlineData("/strip/a%2f..", null)]
    [InlineData("/strip/..;/admin", null)]
    [InlineData("/strip/%2E%2E;x=1/admin", null)]
    [InlineData("/strip/..%5Cadmin", null)]
    [InlineData("http://localhost/strip/.%2Fadmin", "/admin")] // '.' leads nowhere else
    [InlineData("https://localhost/strip/a", "/a")]
    [InlineData("/strip/a..b/...", "/a..b/...")]
    [InlineData("https://localhost/strip/%2E%2E/x", "/x")] // resolved by Kestrel: route 'all'
    public async Task PathWithAParentSegmentAnUpstreamCouldResolve_400AndNothingForwarded(string target, string? forwarded)
    {
        foreach (var http2 in target.StartsWith('/') ? new[] { false, true } : [false])
        {
            _upstream.Clear();
            var (status, answer) = await ExchangeAsync(http2, "GET", target);
            if (answer is not null && forwarded is null)
            {
                Assert.Contains("400 Bad Request: the target's path has a '..' segment that an upstream could resolve to a path Tern did not route (beside an escaped '/', a '\\' or a ';')", answer, StringComparison.Ordinal);
            }

            if (forwarded is null)
            {
                Assert.Equal("400", status);
                Assert.Empty(_upstream.Requests);
            }
            else
            {
                Assert.Equal("200", status);
                Assert.Equal(forwarded, Assert.Single(_upstream.Requests).Target);
            }
        }
    }

    /// <summary>
    /// Expect is Tern's to answer (Kestrel sends 100 Continue when the body is read), not the
    /// upstream's: passed on, .NET's client waited a second for an upstream's 100 before sending
    /// the body (this upstream, like many, sends none). Unknown expectations are dropped too.
    /// </summary>
    [Theory]
    [InlineData("1.1", "100-continue")]
    [InlineData("2.0", "100-continue")]
    [InlineData("1.1", "something-else")]
    public async Task Request_Expect_IsAnsweredByTernAndNotForwarded(string version, string expectation)
    {
        _upstream.Clear();
        using var client = _tern.CreateClient(version: Version.Parse(version));
        using var request = new HttpRequestMessage(HttpMethod.Post, "/a") { Content = new StringContent("hello") };
        request.Headers.TryAddWithoutValidation("Expect", expectation);
        using var response = await client.SendAsync(request);

        Assert.Equal(HttpStatusCode.OK, response.StatusCode);
        var only = Assert.Single(_upstream.Requests);
        Assert.Equal("hello", only.Body);
        Assert.DoesNotContain(only.Headers, h => h.Name.Equals("Expect", StringComparison.OrdinalIgnoreCase));
    }

    private const string ResponseBytes = "attachment; filename=\"caf\u00c3\u00a9 \u00e9t\u00e9 \u0080\u00ff.txt\"";

    private static async Task AnswerAsync(TcpClient client, CancellationToken stop)
    {
        const string Poison = "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\npoison";
        using var _ = client;
        var stream = client.GetStream();
        var received = new StringBuilder();
        var buffer = new byte[16 * 1024];
        try
        {
            while (true)
            {
                var end = received.ToString().IndexOf("\r\n\r\n", StringComparison.Ordinal);
                if (end < 0)
                {
                    var read = await stream.ReadAsync(buffer, stop);
                    if (read == 0)
                    {
                        return;
                    }

                    received.Append(Encoding.Latin1.GetString(buffer, 0, read));
                    continue;
                }

                var path = received.ToString().Split(' ')[1];
                received.Remove(0, end + 4);
                var answer = path switch
                {
                    "/r/extra" => "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" + Poison,
                    "/r/both" => "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n" + Poison,
                    "/r/cr" => "HTTP/1.1 200 OK\r\nX-A: b\rSet-Cookie: evil=1\r\nContent-Length: 2\r\n\r\nok",
                    "/r/nul" => "HTTP/1.1 200 OK\r\nX-A: b\0Set-Cookie: evil=1\r\nContent-Length: 2\r\n\r\nok",
                    "/r/fold" => "HTTP/1.1 200 OK\r\nX-A: b\r\n Set-Cookie: evil=1\r\nContent-Length: 2\r\n\r\nok",
                    "/r/lf" => "HTTP/1.1 200 OK\r\nX-A: b\nSet-Cookie: evil=1\r\nContent-Length: 2\r\n\r\nok",
                    "/r/bytes" => $"HTTP/1.1 200 OK\r\nContent-Disposition: {ResponseBytes}\r\nContent-Length: 2\r\n\r\nok",
                    _ => "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnext",
                };
                await stream.WriteAsync(Encoding.Latin1.GetBytes(answer), stop);
            }
        }
        catch (Exception e) when (e is IOException or OperationCanceledException)
        {
            // Tern closed the connection (as it should after a response with bytes to spare).
        }
    }

    /// <summary>The recording upstream itself, sent requests directly: it must flag what the tests above rely on it to flag.</summary>
    [Theory]
    [InlineData("POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", "framing")]
    [InlineData("POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: +3\r\n\r\nabc", "Content-Length")]
    [InlineData("GET /a HTTP/1.1\nHost: x\r\n\r\n", "LF alone")]
    [InlineData("GET /a HTTP/1.1\r\nHost: x\r\nX-A: b\rX-Injected: 1\r\n\r\n", "bare CR")]
    [InlineData("GET /a HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n", "header line")]
    [InlineData("POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3;x\r\nabc\r\n0\r\n\r\n", "chunk size")]
    public async Task Recorder_FlagsFramingItCannotReadOneWay(string request, string violation)
    {
        using var client = new TcpClient();
        await client.ConnectAsync(new Uri(_upstream.Address).Host, new Uri(_upstream.Address).Port);
        await client.GetStream().WriteAsync(Encoding.Latin1.GetBytes(request + "GET /b HTTP/1.1\r\nHost: x\r\n\r\n"));
        for (var waited = 0; _upstream.Violations.IsEmpty && waited < 5000; waited += 20)
        {
            await Task.Delay(20);
        }

        Assert.Contains(violation, Assert.Single(_upstream.Violations), StringComparison.Ordinal);
        Assert.Empty(_upstream.Requests); // and it stops reading that connection
    }

    /// <summary>What the server sends until it closes or stays silent for half a second (at most 10 s).</summary>
    private static async Task<string> ReadUntilQuietAsync(Stream stream)
    {
        var received = new StringBuilder();
        var buffer = new byte[16 * 1024];
        var deadline = DateTime.UtcNow.AddSeconds(10);
        while (DateTime.UtcNow < deadline)
        {
            using var quiet = new CancellationTokenSource(received.Length == 0 ? TimeSpan.FromSeconds(5) : TimeSpan.FromMilliseconds(500));
            int read;
            try
            {
                read = await stream.ReadAsync(buffer, quiet.Token);
            }
            catch (OperationCanceledException)
            {
                break;
            }
            catch (IOException)
            {
                break; // a reset after the answer
            }

            if (read == 0)
            {
                break;
            }

            received.Append(Encoding.Latin1.GetString(buffer, 0, read));
        }

        return received.ToString();
    }

    /// <summary>
    /// One request on stream 1 (<see cref="Http2Frames"/>): "refused" for a RST_STREAM or GOAWAY, the
    /// :status of the response's HEADERS otherwise, "closed" if the connection ends first.
    /// </summary>
    /// <summary>
    /// One request without a body on a new connection to the HTTPS listener, over HTTP/2 or
    /// HTTP/1.1: the status, and over HTTP/1.1 the whole answer (null over HTTP/2).
    /// </summary>
    private async Task<(string Status, string? Answer)> ExchangeAsync(bool http2, string method, string target, params (string Name, string Value)[] fields)
    {
        await using var client = await RawHttp.ConnectAsync(_tern.Config.HttpsPort, http2: http2);
        if (http2)
        {
            return (await Http2Exchange(client.Stream, [(":method", method), (":scheme", "https"), (":authority", "localhost"), (":path", target), .. fields], null), null);
        }

        await client.WriteAsync($"{method} {target} HTTP/1.1\r\nHost: localhost\r\n{string.Concat(fields.Select(f => $"{f.Name}: {f.Value}\r\n"))}Connection: close\r\n\r\n");
        var answer = await client.ReadUntilAsync("\0");
        return (answer[9..12], answer);
    }

    private static async Task<string> Http2Exchange(Stream stream, List<(string Name, string Value)> headers, byte[]? body)
    {
        var output = new MemoryStream();
        Http2Frames.WritePreface(output);
        Http2Frames.WriteFrame(output, Http2Frames.Headers, (byte)(Http2Frames.EndHeaders | (body is null ? Http2Frames.EndStream : 0)), 1, Http2Frames.HeaderBlock(headers));
        if (body is not null)
        {
            Http2Frames.WriteFrame(output, Http2Frames.Data, Http2Frames.EndStream, 1, body);
        }

        await stream.WriteAsync(output.ToArray());

        using var timeout = new CancellationTokenSource(TimeSpan.FromSeconds(10));
        while (await Http2Frames.ReadFrameAsync(stream, timeout.Token) is { } frame)
        {
            var (type, streamId, payload) = frame;
            if (type == Http2Frames.GoAway || (type == Http2Frames.RstStream && streamId == 1))
            {
                return "refused";
            }

            if (type == Http2Frames.Headers && streamId == 1)
            {
                return Status(payload);
            }
        }

        return "closed";
    }

    /// <summary>The :status Kestrel encodes first in a response's header block: an indexed static entry (200 is 0x88), or a literal of the :status name with a plain value.</summary>
    private static string Status(byte[] block) => block[0] switch
    {
        >= 0x88 and <= 0x8e => new[] { "200", "204", "206", "304", "400", "404", "500" }[block[0] - 0x88],
        0x08 or 0x48 when block[1] < 0x80 => Encoding.ASCII.GetString(block, 2, block[1]),
        _ => $"unknown ({block[0]:x2})",
    };

    private sealed record Request(string Method, string Target, List<(string Name, string Value)> Headers, string Body, List<(string Name, string Value)> Trailers);

    /// <summary>
    /// An HTTP/1.1 server as strict as RFC 9112 lets it be: CRLF-ended lines only, one framing (a
    /// single Content-Length of digits, or Transfer-Encoding: chunked alone), no folded or malformed
    /// header lines. What it cannot read one way only is a violation; each request it reads whole is
    /// recorded and answered with a 200 naming its path.
    /// </summary>
    private sealed class RecordingUpstream : IDisposable
    {
        private readonly RawUpstream _raw;

        public RecordingUpstream() => _raw = new RawUpstream(ServeAsync);

        public string Address => _raw.Address;

        public ConcurrentQueue<Request> Requests { get; private set; } = new();

        public ConcurrentQueue<string> Violations { get; private set; } = new();

        public void Clear()
        {
            Requests = new();
            Violations = new();
        }

        public void Dispose() => _raw.Dispose();

        private async Task ServeAsync(TcpClient client, CancellationToken stop)
        {
            using var _ = client;
            var stream = client.GetStream();
            var reader = new Reader(stream);
            try
            {
                while (await reader.ReadRequestAsync(stop) is { } request)
                {
                    Requests.Enqueue(request);
                    var answer = Encoding.ASCII.GetBytes("ok " + request.Target);
                    await stream.WriteAsync(Encoding.ASCII.GetBytes($"HTTP/1.1 200 OK\r\nContent-Length: {answer.Length}\r\n\r\n").Concat(answer).ToArray(), stop);
                }
            }
            catch (InvalidDataException e)
            {
                Violations.Enqueue(e.Message);
            }
            catch (Exception e) when (e is IOException or OperationCanceledException or EndOfStreamException)
            {
                // Tern gave up on the request (its client's body was refused): nothing whole to record.
            }
        }

        private sealed class Reader(Stream stream)
        {
            private readonly byte[] _buffer = new byte[64 * 1024];
            private int _start;
            private int _end;

            public async Task<Request?> ReadRequestAsync(CancellationToken cancellationToken)
            {
                var line = await ReadLineAsync(cancellationToken, eofAllowed: true);
                if (line is null)
                {
                    return null;
                }

                var parts = line.Split(' ');
                if (parts.Length != 3 || parts[2] != "HTTP/1.1" || parts[0].Length == 0 || !parts[1].StartsWith('/'))
                {
                    throw new InvalidDataException($"request line '{line}'");
                }

                var headers = await ReadFieldsAsync(cancellationToken);
                var lengths = headers.Where(h => h.Name.Equals("Content-Length", StringComparison.OrdinalIgnoreCase)).ToList();
                var codings = headers.Where(h => h.Name.Equals("Transfer-Encoding", StringComparison.OrdinalIgnoreCase)).ToList();
                var trailers = new List<(string, string)>();
                string body;
                if (codings.Count > 0)
                {
                    if (lengths.Count > 0 || codings.Count > 1 || codings[0].Value != "chunked")
                    {
                        throw new InvalidDataException($"framing of {line}: {string.Join(", ", lengths.Concat(codings))}");
                    }

                    var content = new StringBuilder();
                    while (true)
                    {
                        var size = await ReadLineAsync(cancellationToken) ?? throw new EndOfStreamException();
                        if (size.Length is 0 or > 8 || !size.All(Uri.IsHexDigit))
                        {
                            throw new InvalidDataException($"chunk size '{size}'");
                        }

                        var count = Convert.ToInt32(size, 16);
                        if (count == 0)
                        {
                            break;
                        }

                        content.Append(await ReadBytesAsync(count, cancellationToken));
                        if (await ReadLineAsync(cancellationToken) is not "")
                        {
                            throw new InvalidDataException("chunk not followed by CRLF");
                        }
                    }

                    trailers = await ReadFieldsAsync(cancellationToken);
                    body = content.ToString();
                }
                else if (lengths.Count > 0)
                {
                    if (lengths.Count > 1 || lengths[0].Value.Length == 0 || !lengths[0].Value.All(char.IsAsciiDigit))
                    {
                        throw new InvalidDataException($"Content-Length of {line}: {string.Join(", ", lengths)}");
                    }

                    body = await ReadBytesAsync(int.Parse(lengths[0].Value, System.Globalization.CultureInfo.InvariantCulture), cancellationToken);
                }
                else
                {
                    body = "";
                }

                return new Request(parts[0], parts[1], headers, body, trailers);
            }

            private async Task<List<(string Name, string Value)>> ReadFieldsAsync(CancellationToken cancellationToken)
            {
                var fields = new List<(string, string)>();
                while (await ReadLineAsync(cancellationToken) is { Length: > 0 } field)
                {
                    var colon = field.IndexOf(':', StringComparison.Ordinal);
                    var name = colon > 0 ? field[..colon] : "";
                    if (name.Length == 0 || !name.All(c => char.IsAsciiLetterOrDigit(c) || "!#$%&'*+-.^_`|~".Contains(c)) || field.Any(c => c < 0x20 && c != '\t'))
                    {
                        throw new InvalidDataException($"header line '{field}'");
                    }

                    fields.Add((name, field[(colon + 1)..].Trim(' ', '\t')));
                }

                return fields;
            }

            private async Task<string?> ReadLineAsync(CancellationToken cancellationToken, bool eofAllowed = false)
            {
                while (true)
                {
                    var lf = Array.IndexOf(_buffer, (byte)'\n', _start, _end - _start);
                    if (lf >= 0)
                    {
                        if (lf == _start || _buffer[lf - 1] != '\r')
                        {
                            throw new InvalidDataException("a line ended by LF alone");
                        }

                        var line = Encoding.Latin1.GetString(_buffer, _start, lf - 1 - _start);
                        _start = lf + 1;
                        if (line.Contains('\r'))
                        {
                            throw new InvalidDataException($"a bare CR in '{line}'");
                        }

                        return line;
                    }

                    if (!await FillAsync(cancellationToken))
                    {
                        return eofAllowed && _start == _end ? null : throw new EndOfStreamException();
                    }
                }
            }

            private async Task<string> ReadBytesAsync(int count, CancellationToken cancellationToken)
            {
                var text = new StringBuilder();
                while (count > 0)
                {
                    if (_start == _end && !await FillAsync(cancellationToken))
                    {
                        throw new EndOfStreamException();
                    }

                    var take = Math.Min(count, _end - _start);
                    text.Append(Encoding.Latin1.GetString(_buffer, _start, take));
                    _start += take;
                    count -= take;
                }

                return text.ToString();
            }

            private async Task<bool> FillAsync(CancellationToken cancellationToken)
            {
                if (_start > 0)
                {
                    Array.Copy(_buffer, _start, _buffer, 0, _end - _start);
                    _end -= _start;
                    _start = 0;
                }

                if (_end == _buffer.Length)
                {
                    throw new InvalidDataException("a line longer than 64 KB");
                }

                var read = await stream.ReadAsync(_buffer.AsMemory(_end), cancellationToken);
                _end += read;
                return read > 0;
            }
        }
    }
}
