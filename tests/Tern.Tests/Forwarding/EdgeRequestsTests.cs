using System.Net;
using System.Text.Json.Nodes;
using Tern.Tests.Infrastructure;

namespace Tern.Tests.Forwarding;

/// <summary>
/// What Tern answers itself before routing (EdgeRequests). Requests without a Host and TRACE are
/// refused as nginx refuses them, and never reach an upstream.
/// Routes that differ only in the headers they match (a canary by X-Canary, a version by
/// X-Version) are a valid configuration, but a request carrying both headers matches both alike.
/// The router then throws: before, that was Kestrel's 500 with an error and a stack trace in the
/// log for each such request, which any client could send. Now it is a 500 that says why and one
/// warning naming the routes; other requests are unaffected.
/// </summary>
public sealed class EdgeRequestsTests : IAsyncLifetime
{
    private TestUpstream _canary = null!;
    private TestUpstream _v2 = null!;
    private TestUpstream _main = null!;
    private TernInstance _tern = null!;

    public async Task InitializeAsync()
    {
        _canary = await TestUpstream.StartAsync("canary");
        _v2 = await TestUpstream.StartAsync("v2");
        _main = await TestUpstream.StartAsync("main");
        var config = new TernConfig(Proxy.Tls.TlsEngines.OpenSsl)
            .Route("all", "main", "{**catch-all}").Cluster("main", [_main])
            .Route("canary", "canary", "{**catch-all}").Cluster("canary", [_canary])
            .Route("v2", "v2", "{**catch-all}").Cluster("v2", [_v2]);
        var routes = (JsonObject)config.ReverseProxy["Routes"]!;
        routes["canary"]!["Match"]!["Headers"] = new JsonArray(new JsonObject { ["Name"] = "X-Canary", ["Values"] = new JsonArray("1") });
        routes["v2"]!["Match"]!["Headers"] = new JsonArray(new JsonObject { ["Name"] = "X-Version", ["Values"] = new JsonArray("2") });
        _tern = await TernInstance.StartAsync(config);
    }

    public async Task DisposeAsync()
    {
        await _tern.DisposeAsync();
        await _canary.DisposeAsync();
        await _v2.DisposeAsync();
        await _main.DisposeAsync();
    }

    [Theory]
    [InlineData("1.1")]
    [InlineData("2.0")]
    public async Task RequestTwoRoutesMatchAlike_500SaysWhyAndOneLineNamesThem(string version)
    {
        using var client = _tern.CreateClient(version: Version.Parse(version));
        Assert.Equal("canary", await Send(client, ("X-Canary", "1")));
        Assert.Equal("v2", await Send(client, ("X-Version", "2")));
        Assert.Equal("main", await Send(client));

        using var both = new HttpRequestMessage(HttpMethod.Get, "/name");
        both.Headers.Add("X-Canary", "1");
        both.Headers.Add("X-Version", "2");
        using var response = await client.SendAsync(both);

        Assert.Equal(HttpStatusCode.InternalServerError, response.StatusCode);
        Assert.Equal("500 Internal Server Error: more than one route matches this request alike, and none was chosen\n", await response.Content.ReadAsStringAsync());
        // The router names every route that matches (in an order of its own), the one that ranks after the two as well.
        var line = await _tern.Logs.WaitForAsync("GET /name returned 500: two or more of the routes that match it (");
        Assert.StartsWith("Warning: Tern.Proxy.Forwarding: ", line, StringComparison.Ordinal);
        var named = line[(line.IndexOf("match it (", StringComparison.Ordinal) + 10)..line.IndexOf(") match it alike", StringComparison.Ordinal)];
        Assert.Equal(["all", "canary", "v2"], named.Split(", ").Order());
        Assert.DoesNotContain(_tern.Logs.Lines, l => l.StartsWith("Error:", StringComparison.Ordinal) || l.Contains("AmbiguousMatchException", StringComparison.Ordinal));

        // The connection serves on.
        Assert.Equal("main", await Send(client));
    }

    /// <summary>
    /// A Host whose punycode does not decode: ASP.NET Core's Request.Host throws on it, a 500 with
    /// a stack trace that any client could cause. 400 with the reason; a good one is served.
    /// </summary>
    [Theory]
    [InlineData("xn--zz.example", "400 Bad Request: the Host header's name is not valid punycode (xn--)\n")]
    [InlineData("XN--.example", "400 Bad Request: the Host header's name is not valid punycode (xn--)\n")]
    [InlineData("xn--bcher-kva.example", "main")]
    public async Task HostInPunycodeThatDoesNotDecode_400(string host, string answer)
    {
        using var client = _tern.CreateClient(host: host);

        using var response = await client.GetAsync(new Uri("/name", UriKind.Relative));

        Assert.Equal(answer, await response.Content.ReadAsStringAsync());
        Assert.DoesNotContain(_tern.Logs.Lines, l => l.Contains("ArgumentException", StringComparison.Ordinal) || l.StartsWith("Error:", StringComparison.Ordinal));
    }

    [Theory]
    [InlineData("GET /x HTTP/1.1\r\nHost: \r\nConnection: close\r\n\r\n")] // .NET's client sent two Hosts: the destination's and this empty one
    [InlineData("GET /x HTTP/1.1\r\nHost:    \r\nConnection: close\r\n\r\n")]
    [InlineData("GET /x HTTP/1.0\r\n\r\n")] // the upstream got the destination's own address as Host
    public async Task RequestWithoutAHost_400AndNothingReachesTheUpstream(string request)
    {
        var before = _main.Requests;
        await using var client = await RawHttp.ConnectAsync(_tern.Config.HttpsPort);
        await client.WriteAsync(request);
        var answer = await client.ReadUntilAsync("\0");

        Assert.StartsWith("HTTP/1.1 400 ", answer, StringComparison.Ordinal);
        Assert.Contains("\r\n400 Bad Request: a Host header is required\n", answer, StringComparison.Ordinal); // chunked over HTTP/1.1, whole over HTTP/1.0
        Assert.Equal(before, _main.Requests);
    }

    [Theory]
    [InlineData("1.1")]
    [InlineData("2.0")]
    public async Task Trace_405AndNothingReachesTheUpstream(string version)
    {
        var before = _main.Requests;
        using var client = _tern.CreateClient(version: Version.Parse(version));
        using var trace = new HttpRequestMessage(HttpMethod.Trace, "/name");
        trace.Headers.Add("Cookie", "session=secret");
        using var response = await client.SendAsync(trace);

        Assert.Equal(HttpStatusCode.MethodNotAllowed, response.StatusCode);
        Assert.StartsWith("405 Method Not Allowed: Tern does not forward TRACE", await response.Content.ReadAsStringAsync(), StringComparison.Ordinal);
        Assert.Equal(before, _main.Requests);
        Assert.Equal("main", await Send(client)); // and the connection serves on
    }

    private static async Task<string> Send(HttpClient client, params (string Name, string Value)[] headers)
    {
        using var request = new HttpRequestMessage(HttpMethod.Get, "/name");
        foreach (var (name, value) in headers)
        {
            request.Headers.Add(name, value);
        }

        using var response = await client.SendAsync(request);
        Assert.Equal(HttpStatusCode.OK, response.StatusCode);
        return await response.Content.ReadAsStringAsync();
    }
}
