using Microsoft.AspNetCore.Http;
using Yarp.ReverseProxy.Configuration;

namespace Tern.Proxy.Forwarding;

/// <summary>
/// A session-affinity cookie (the Cookie and ArrCookie policies) is marked Secure when it is set
/// over HTTPS, where the cluster gives no SecurePolicy: ASP.NET Core's own default for its cookies
/// (SameAsRequest). YARP's default set none, so a browser sent the cookie Tern had set over TLS in
/// clear text to the plain-HTTP listener too, and scanners flag every such response. A cluster's
/// own SecurePolicy, None included, is kept.
/// </summary>
internal sealed class AffinityCookieDefaults : IProxyConfigFilter
{
    public ValueTask<ClusterConfig> ConfigureClusterAsync(ClusterConfig cluster, CancellationToken cancel)
    {
        if (cluster.SessionAffinity is not { } affinity || affinity.Cookie?.SecurePolicy is not null)
        {
            return new(cluster);
        }

        // Every other setting of an absent Cookie section is YARP's default when null, as here.
        var cookie = (affinity.Cookie ?? new SessionAffinityCookieConfig()) with { SecurePolicy = CookieSecurePolicy.SameAsRequest };
        return new(cluster with { SessionAffinity = affinity with { Cookie = cookie } });
    }

    public ValueTask<RouteConfig> ConfigureRouteAsync(RouteConfig route, ClusterConfig? cluster, CancellationToken cancel) => new(route);
}
