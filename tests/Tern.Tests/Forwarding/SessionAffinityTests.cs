using System.Net;
using System.Text.Json.Nodes;
using Tern.Tests.Infrastructure;

namespace Tern.Tests.Forwarding;

/// <summary>
/// The session-affinity cookie YARP sets (ArrCookie, which needs no Data Protection key; Cookie
/// takes the same settings) is marked Secure where it is set over HTTPS and the cluster gives no
/// SecurePolicy, as ASP.NET Core marks its own; YARP alone never marked it, so a browser sent it in
/// clear text to the plain-HTTP listener too. A SecurePolicy the cluster gives is kept.
/// </summary>
public sealed class SessionAffinityTests : IAsyncLifetime
{
    private TestUpstream _upstream = null!;

    public async Task InitializeAsync() => _upstream = await TestUpstream.StartAsync("app");

    public async Task DisposeAsync() => await _upstream.DisposeAsync();

    [Theory]
    [InlineData(null, "https", true)]
    [InlineData(null, "http", false)] // SameAsRequest: a route served over plain HTTP cannot mark it
    [InlineData("None", "https", false)]
    [InlineData("Always", "http", true)]
    public async Task AffinityCookie_SecureOverHttps_UnlessTheClusterSaysOtherwise(string? securePolicy, string scheme, bool secure)
    {
        var affinity = new JsonObject { ["Enabled"] = true, ["Policy"] = "ArrCookie", ["AffinityKeyName"] = "tern-affinity" };
        if (securePolicy is not null)
        {
            affinity["Cookie"] = new JsonObject { ["SecurePolicy"] = securePolicy };
        }

        var config = new TernConfig(Proxy.Tls.TlsEngines.OpenSsl)
            .Route("all", "app", "{**catch-all}", new JsonObject { ["Metadata"] = new JsonObject { ["Tern.AllowPlainHttp"] = "true" } })
            .Cluster("app", [_upstream], new JsonObject { ["SessionAffinity"] = affinity });
        await using var tern = await TernInstance.StartAsync(config);
        using var client = scheme == "https" ? tern.CreateClient() : tern.CreatePlainClient(config.HttpPort);

        using var response = await client.GetAsync(new Uri("/name", UriKind.Relative));

        Assert.Equal(HttpStatusCode.OK, response.StatusCode);
        var cookie = Assert.Single(response.Headers.GetValues("Set-Cookie"));
        Assert.StartsWith("tern-affinity=", cookie, StringComparison.Ordinal);
        Assert.Equal(secure, cookie.Split("; ").Contains("secure", StringComparer.OrdinalIgnoreCase));
        Assert.Contains("httponly", cookie, StringComparison.OrdinalIgnoreCase);
    }
}
