using System.Net;
using System.Text.Json.Nodes;
using Tern.Tests.Infrastructure;

namespace Tern.Tests.Forwarding;

/// <summary>
/// Headers Tern keeps from the other side by default, as nginx does: request headers whose names
/// have an underscore (Tern:Forwarding:UnderscoresInHeaders; CGI, PHP, WSGI and Rack name headers
/// HTTP_X_FORWARDED_FOR, a dash and an underscore alike, so a client's X_Forwarded_For would arrive
/// under the name of the header Tern sets), and the upstream's Server response header, which names
/// its software and version (Tern:Forwarding:PassServerHeader); and a redirect to the upstream's own
/// address, which becomes the path the client used (Tern:Forwarding:RewriteRedirects), the prefixes
/// a route removes and adds swapped back.
/// </summary>
public sealed class HeaderDefaultsTests : IAsyncLifetime
{
    private TestUpstream _upstream = null!;
    private TernInstance _tern = null!;

    public async Task InitializeAsync()
    {
        _upstream = await TestUpstream.StartAsync();
        var config = TernConfig.To(Proxy.Tls.TlsEngines.OpenSsl, _upstream)
            .Route("app", "app", "/app/{**rest}", new JsonObject { ["Transforms"] = new JsonArray(new JsonObject { ["PathRemovePrefix"] = "/app" }) })
            .Route("set", "app", "/set/{**rest}", new JsonObject { ["Transforms"] = new JsonArray(new JsonObject { ["PathSet"] = "/redirect" }) })
            .Route("moved", "app", "/moved/{**rest}", new JsonObject { ["Transforms"] = new JsonArray(new JsonObject { ["PathRemovePrefix"] = "/moved" }, new JsonObject { ["PathPrefix"] = "/v2" }) })
            .Route("swapped", "app", "/old/{**rest}", new JsonObject { ["Transforms"] = new JsonArray(new JsonObject { ["PathPattern"] = "/v2/{**rest}" }) })
            .Route("paged", "app", "/p/{page}", new JsonObject { ["Transforms"] = new JsonArray(new JsonObject { ["PathPattern"] = "/v2/{page}" }) })
            .Route("versioned", "app", "/svc/{version}/{**rest}", new JsonObject { ["Transforms"] = new JsonArray(new JsonObject { ["PathPattern"] = "/{version}/{**rest}" }) });
        _tern = await TernInstance.StartAsync(config);
    }

    public async Task DisposeAsync()
    {
        await _tern.DisposeAsync();
        await _upstream.DisposeAsync();
    }

    [Theory]
    [InlineData("1.1")]
    [InlineData("2.0")]
    public async Task HeaderNamesWithUnderscores_DroppedByDefault(string version)
    {
        using var client = _tern.CreateClient(version: Version.Parse(version));
        var received = await Headers(client, ("X_Forwarded_For", "203.0.113.9"), ("X_Client_Cert", "forged"), ("my_header", "1"), ("X-Kept", "1"));

        Assert.DoesNotContain(received.Keys, name => name.Contains('_', StringComparison.Ordinal));
        Assert.Equal("127.0.0.1", received["X-Forwarded-For"]);
        Assert.Equal("1", received["X-Kept"]);
    }

    /// <summary>
    /// A route's own transform may still set such a header (the drop comes first); each request
    /// whose headers were dropped is logged at Debug; Tern:Forwarding:UnderscoresInHeaders passes
    /// them on, and takes effect on reload.
    /// </summary>
    [Fact]
    public async Task HeaderNamesWithUnderscores_RouteMaySetOneAndTheSettingPassesThemOn()
    {
        using var client = _tern.CreateClient();
        var config = _tern.Config;
        config.ForwardingLogLevel = "Debug";
        config.ReverseProxy["Routes"]!["all"]!["Transforms"] = new JsonArray(new JsonObject { ["RequestHeader"] = "X_Tenant", ["Set"] = "acme" });
        await _tern.RewriteConfigAsync(config.ToJson());
        await _tern.Logs.WaitForAsync("Configuration reloaded");

        var received = await Headers(client, ("my_header", "1"), ("X_Tenant", "forged"));
        Assert.Equal("acme", received["X_Tenant"]);
        Assert.False(received.ContainsKey("my_header"));
        var line = await _tern.Logs.WaitForAsync("GET /headers: request headers ");
        Assert.Equal("Debug: Tern.Proxy.Forwarding: GET /headers: request headers my_header, X_Tenant not forwarded: their names have underscores (Tern:Forwarding:UnderscoresInHeaders)", line);

        config.Tern["Forwarding"] = new JsonObject { ["UnderscoresInHeaders"] = true };
        var logged = _tern.Logs.Count;
        await _tern.RewriteConfigAsync(config.ToJson());
        await _tern.Logs.WaitForAsync("Configuration reloaded", after: logged);
        received = await Headers(client, ("my_header", "1"));
        Assert.Equal("1", received["my_header"]);
    }

    [Theory]
    [InlineData("1.1")]
    [InlineData("2.0")]
    public async Task UpstreamServerHeader_NotPassedOnByDefault(string version)
    {
        using var client = _tern.CreateClient(version: Version.Parse(version));
        using var response = await client.GetAsync(new Uri("/name", UriKind.Relative));

        Assert.Equal(HttpStatusCode.OK, response.StatusCode);
        Assert.Equal("up", response.Headers.GetValues("X-Upstream").Single()); // the upstream's other headers pass
        Assert.False(response.Headers.Contains("Server"));
    }

    /// <summary>A route may set its own; Tern:Forwarding:PassServerHeader passes the upstream's on, and takes effect on reload.</summary>
    [Fact]
    public async Task UpstreamServerHeader_RouteMaySetOneAndTheSettingPassesItOn()
    {
        using var client = _tern.CreateClient();
        var config = _tern.Config;
        config.ReverseProxy["Routes"]!["all"]!["Transforms"] = new JsonArray(new JsonObject { ["ResponseHeader"] = "Server", ["Set"] = "edge" });
        await _tern.RewriteConfigAsync(config.ToJson());
        await _tern.Logs.WaitForAsync("Configuration reloaded");
        using (var response = await client.GetAsync(new Uri("/name", UriKind.Relative)))
        {
            Assert.Equal("edge", response.Headers.GetValues("Server").Single());
        }

        config.ReverseProxy["Routes"]!["all"]!.AsObject().Remove("Transforms");
        config.Tern["Forwarding"] = new JsonObject { ["PassServerHeader"] = true };
        var logged = _tern.Logs.Count;
        await _tern.RewriteConfigAsync(config.ToJson());
        await _tern.Logs.WaitForAsync("Configuration reloaded", after: logged);
        using (var response = await client.GetAsync(new Uri("/name", UriKind.Relative)))
        {
            Assert.Equal("Kestrel", response.Headers.GetValues("Server").Single()); // the test upstream's
        }
    }

    [Theory]
    [InlineData("/redirect", "{self}login?next=%2Fa", "/login?next=%2Fa")]
    [InlineData("/redirect", "{self}", "/")]
    [InlineData("/redirect", "{SELF}x", "/x")] // scheme and host in any case
    [InlineData("/redirect", "{self-no-slash}?q=1", "/?q=1")]
    [InlineData("/app/redirect", "{self}login", "/app/login")] // the prefix the route removed, put back
    [InlineData("/redirect", "https://elsewhere.test/login", "https://elsewhere.test/login")] // another site
    [InlineData("/redirect", "/relative", "/relative")]
    [InlineData("/redirect", "{self}\\evil.com/x", "{self}\\evil.com/x")] // made /\evil.com/x, a browser would go to evil.com: left alone
    [InlineData("/redirect", "{self}/evil.com/x", "/evil.com/x")] // the slashes before it are one
    [InlineData("/set/x", "{self}login", "{self}login")] // a route that rewrites the path otherwise: left alone
    [InlineData("/moved/redirect", "{self}v2/login?x=1", "/moved/login?x=1")] // a route that removes /moved and adds /v2: /v2 taken off, /moved put back
    [InlineData("/moved/redirect", "{self}v2", "/moved")] // /v2 itself: /moved reaches it (/moved/ reaches /v2/)
    [InlineData("/old/redirect", "{self}v2/login", "/old/login")] // a PathPattern that swaps /old for /v2, alike
    [InlineData("/old/redirect", "{self}login", "{self}login")] // not under the prefix the route adds: left alone, as by nginx
    [InlineData("/old/redirect", "{self}v22/login", "{self}v22/login")]
    [InlineData("/old/redirect", "{self}v2?x=1", "/old?x=1")]
    [InlineData("/old/redirect", "{self}V2/login", "{self}V2/login")] // a path is compared as written
    [InlineData("/p/redirect", "{self}v2/login?x=1", "/p/login?x=1")] // any other PathPattern, undone: /v2/{page} back to /p/{page}
    [InlineData("/p/redirect", "{self}v3/login", "{self}v3/login")] // not the pattern's literal: no path of the route, left alone
    [InlineData("/p/redirect", "{self}v2/a/b", "{self}v2/a/b")] // more segments than the pattern has
    [InlineData("/p/redirect", "{self}v2", "{self}v2")]
    [InlineData("/svc/v2/redirect", "{self}v2/a%2Fb/c#top", "/svc/v2/a%2Fb/c#top")] // each value where Match:Path reads it, as written
    [InlineData("/svc/v2/redirect", "{self}v3/", "/svc/v3/")]
    [InlineData("/svc/v2/redirect", "{self}/evil.com/x", "{self}/evil.com/x")] // an empty segment for a value: left alone
    public async Task RedirectToTheUpstreamsOwnAddress_BecomesTheClientsPath(string path, string location, string expected)
    {
        var self = _upstream.Address.ToString(); // http://127.0.0.1:port/
        string Fill(string s) => s.Replace("{self}", self, StringComparison.Ordinal).Replace("{SELF}", self.ToUpperInvariant(), StringComparison.Ordinal)
            .Replace("{self-no-slash}", self.TrimEnd('/'), StringComparison.Ordinal);

        using var client = _tern.CreateClient();
        using var response = await client.GetAsync(new Uri($"{path}?to={Uri.EscapeDataString(Fill(location))}", UriKind.Relative));

        Assert.Equal(HttpStatusCode.Found, response.StatusCode);
        Assert.Equal(Fill(expected), Assert.Single(response.Headers.NonValidated["Location"]));
    }

    /// <summary>A Refresh header's URL is made the client's too, as nginx's proxy_redirect does.</summary>
    [Theory]
    [InlineData("/refresh", "5; url={self}login", "5; url=/login")]
    [InlineData("/app/refresh", "0;URL='{self}login?x=1'", "0;URL='/app/login?x=1'")] // quoted, the prefix put back
    [InlineData("/refresh", "3; url=https://elsewhere.test/", "3; url=https://elsewhere.test/")]
    [InlineData("/refresh", "30", "30")]
    [InlineData("/old/refresh", "1; url={self}v2/next", "1; url=/old/next")] // a route that swaps /old for /v2
    [InlineData("/p/refresh", "1; url={self}v2/next", "1; url=/p/next")] // a PathPattern's, undone
    public async Task RefreshToTheUpstreamsOwnAddress_BecomesTheClientsPath(string path, string refresh, string expected)
    {
        var self = _upstream.Address.ToString();
        using var client = _tern.CreateClient();
        using var response = await client.GetAsync(new Uri($"{path}?value={Uri.EscapeDataString(refresh.Replace("{self}", self, StringComparison.Ordinal))}", UriKind.Relative));

        Assert.Equal(HttpStatusCode.OK, response.StatusCode);
        Assert.Equal(expected.Replace("{self}", self, StringComparison.Ordinal), response.Headers.GetValues("Refresh").Single());
    }

    [Theory]
    [InlineData("5; url=http://10.0.0.5:8080/login", "5; url=/login")]
    [InlineData("5;URL = \"http://10.0.0.5:8080/a\" ", "5;URL = \"/a\" ")]
    [InlineData("5; url=http://10.0.0.5:80801/login", null)] // another port
    [InlineData("5; url=/login", null)] // relative
    [InlineData("5; urlx=http://10.0.0.5:8080/login", null)]
    [InlineData("5;\tURL\t=\thttp://10.0.0.5:8080/t", "5;\tURL\t=\t/t")]
    [InlineData("5; curl; url=http://10.0.0.5:8080/second", null)] // a browser goes to the relative "curl; url=..."
    [InlineData("0; http://10.0.0.5:8080/go?url=http://10.0.0.5:8080/x", "0; /go?url=http://10.0.0.5:8080/x")] // no "url=": the whole address
    [InlineData("5, 'http://10.0.0.5:8080/comma'", "5, '/comma'")]
    [InlineData("5 url=http://10.0.0.5:8080/space", "5 url=/space")]
    [InlineData(" .5;url=http://10.0.0.5:8080/dot", " .5;url=/dot")] // a delay of dots and digits
    [InlineData("url=http://10.0.0.5:8080/nodelay", null)] // no delay: browsers ignore it
    [InlineData("5x; url=http://10.0.0.5:8080/x", null)]
    [InlineData("5; url  x=http://10.0.0.5:8080/x", null)]
    [InlineData("5; url=", null)]
    [InlineData("5; url='http://10.0.0.5:8080/open", "5; url='/open")] // the quote never closed
    public void ClientRefresh_OnlyItsUrlAtTheDestinationsAddress(string refresh, string? expected) =>
        Assert.Equal(expected, Proxy.Forwarding.EdgeForwardedHeaders.ClientRefresh(refresh, "http://10.0.0.5:8080/", new("/", "", "/")));

    [Theory]
    [InlineData("http://10.0.0.5:8080/login", "http://10.0.0.5:8080/", "/", "/login")]
    [InlineData("http://10.0.0.5:8080/base/login", "http://10.0.0.5:8080/base", "/app/", "/app/login")] // a destination with a path
    [InlineData("http://10.0.0.5:80801/login", "http://10.0.0.5:8080/", "/", null)] // another port
    [InlineData("http://10.0.0.5:8080/basement", "http://10.0.0.5:8080/base", "/", null)] // another path
    [InlineData("http://10.0.0.5:8080#top", "http://10.0.0.5:8080", "/", "/#top")]
    [InlineData("HTTP://10.0.0.5:8080/base/login", "http://10.0.0.5:8080/base", "/", "/login")] // scheme and host in any case
    [InlineData("http://10.0.0.5:8080/BASE/login", "http://10.0.0.5:8080/base", "/", null)] // a path as written
    public void ClientLocation_OnlyAtTheDestinationsAddress(string location, string address, string prefix, string? expected) =>
        Assert.Equal(expected, Proxy.Forwarding.EdgeForwardedHeaders.ClientLocation(location, address, new(prefix, "", prefix)));

    /// <summary>
    /// Where a route adds a prefix, only the paths its own become are the client's (as nginx maps
    /// proxy_pass's URL back to the location's prefix), and the added prefix itself goes back to
    /// the path that reaches it, or is left alone where none does.
    /// </summary>
    [Theory]
    [InlineData("/old", "/v2", "/old/{**rest}", "/old/", "/v2", "/old")] // a PathPattern's swap
    [InlineData("/old", "/v2/", "/old/{**rest}", "/old/", "/v2", null)] // /old reaches /v2/, /v2 no path
    [InlineData("", "/v3", "/add/{**rest}", "/add/", "/v3/add", "/add")] // PathPrefix alone: /v3/x is no path of the route
    [InlineData("", "/v3", null, "/", "/v3", null)] // a route on every path
    [InlineData("/app", "", "/app/{**rest}", "/app/", "", "/app/")] // no prefix added: every path, the removed one put back
    [InlineData("", "/v3", "/add/{id}", null, null, null)] // other parameters: no prefix to tell
    [InlineData("/other", "/v3", "/add/{**rest}", null, null, null)] // a prefix removed that the route's paths do not have
    public void RedirectsFor_ARoutesPrefixes(string removed, string added, string? matchPath, string? client, string? upstream, string? bare) =>
        Assert.Equal(client is null ? null : new Proxy.Forwarding.ClientTarget.Redirects(client, upstream!, bare), Proxy.Forwarding.ClientTarget.RedirectsFor(removed, added, matchPath));

    /// <summary>
    /// A route with any other PathPattern maps an upstream's path back by undoing the pattern: its
    /// values from where the PathPattern put them, to where Match:Path reads them; only a path the
    /// pattern makes, literals as Tern writes them and as many segments, and only where Match:Path
    /// reads no value the pattern drops.
    /// </summary>
    [Theory]
    [InlineData("/svc/{version}/{**rest}", "/{version}/{**rest}", "/v2/a/b", "/svc/v2/a/b")]
    [InlineData("/svc/{version}/{**rest}", "/{version}/{**rest}", "/v2", "/svc/v2")]
    [InlineData("/a/{x}/{y}", "/{y}/{x}", "/2/1", "/a/1/2")] // in any order
    [InlineData("/p/{page}", "/v2/{page}", "/v2/x/", null)] // a segment more than the pattern makes
    [InlineData("/p/{page}", "/v2/{page}", "/V2/x", null)] // the literal as Tern writes it
    [InlineData("/p/{page}", "/C++ docs/{page}", "/C++%20docs/x", "/p/x")]
    [InlineData("/t/{tenant}/{**rest}", "/{**rest}", "/x", null)] // the tenant is not in the upstream's path
    [InlineData("/p/{name}.{ext}", "/files/{name}/{ext}", "/files/a/b", null)] // a pattern YARP fills: no path of Tern's to undo
    [InlineData(null, "/v2/{**catchall}", "/v2/x", "/x")] // a route with Hosts alone
    public void RedirectsOf_APathPattern_UndoneOnlyForThePathsItMakes(string? matchPath, string pattern, string upstream, string? client) =>
        Assert.Equal(client, Proxy.Forwarding.ClientTarget.RedirectsOf([new Dictionary<string, string> { ["PathPattern"] = pattern }], matchPath)?.Pattern?.Fill(upstream));

    [Fact]
    public async Task RedirectToTheUpstreamsOwnAddress_LeftAloneWhenRewriteRedirectsIsOff()
    {
        var config = _tern.Config;
        config.Tern["Forwarding"] = new JsonObject { ["RewriteRedirects"] = false };
        await _tern.RewriteConfigAsync(config.ToJson());
        await _tern.Logs.WaitForAsync("Configuration reloaded");

        var self = $"{_upstream.Address}login";
        using var client = _tern.CreateClient();
        using var response = await client.GetAsync(new Uri($"/redirect?to={Uri.EscapeDataString(self)}", UriKind.Relative));
        Assert.Equal(self, response.Headers.Location!.OriginalString);
    }

    private static async Task<Dictionary<string, string>> Headers(HttpClient client, params (string Name, string Value)[] headers)
    {
        using var request = new HttpRequestMessage(HttpMethod.Get, "/headers");
        foreach (var (name, value) in headers)
        {
            request.Headers.TryAddWithoutValidation(name, value);
        }

        using var response = await client.SendAsync(request);
        Assert.Equal(HttpStatusCode.OK, response.StatusCode);
        return TestUpstream.ParseHeaders(await response.Content.ReadAsStringAsync());
    }
}
