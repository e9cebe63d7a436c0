using Microsoft.Extensions.Configuration;

namespace Tern.Proxy.Configuration;

/// <summary>
/// Checks the parts of the standard YARP "ReverseProxy" section whose mistakes YARP would only
/// show per request (a route to a missing cluster, a destination that is not a URL), with the key.
/// YARP's own validation still runs after this one.
/// </summary>
internal static class ReverseProxyValidator
{
    public const string Section = "ReverseProxy";

    /// <summary>Route metadata key that lets a route answer on the plain-HTTP listener instead of redirecting.</summary>
    public const string AllowPlainHttpMetadata = "Tern.AllowPlainHttp";

    public static void Validate(IConfiguration configuration, List<ConfigurationProblem> problems)
    {
        var clusters = configuration.GetSection($"{Section}:Clusters").GetChildren().ToList();
        var clusterIds = new HashSet<string>(clusters.Select(c => c.Key), StringComparer.OrdinalIgnoreCase);

        foreach (var route in configuration.GetSection($"{Section}:Routes").GetChildren())
        {
            var clusterId = route["ClusterId"];
            if (string.IsNullOrWhiteSpace(clusterId))
            {
                problems.Add(new($"{route.Path}:ClusterId", "is required: the id of a cluster under ReverseProxy:Clusters"));
            }
            else if (!clusterIds.Contains(clusterId))
            {
                problems.Add(new($"{route.Path}:ClusterId", $"cluster '{clusterId}' is not defined under ReverseProxy:Clusters"));
            }

            var allowPlain = route[$"Metadata:{AllowPlainHttpMetadata}"];
            if (allowPlain is not null && !bool.TryParse(allowPlain, out _))
            {
                problems.Add(new($"{route.Path}:Metadata:{AllowPlainHttpMetadata}", $"'{allowPlain}' is not true or false"));
            }
        }

        foreach (var cluster in clusters)
        {
            var destinations = cluster.GetSection("Destinations").GetChildren().ToList();
            if (destinations.Count == 0)
            {
                problems.Add(new($"{cluster.Path}:Destinations", "the cluster has no destinations; add one with an Address"));
            }

            foreach (var destination in destinations)
            {
                var address = destination["Address"];
                if (!Uri.TryCreate(address, UriKind.Absolute, out var uri) || (uri.Scheme != Uri.UriSchemeHttp && uri.Scheme != Uri.UriSchemeHttps) || string.IsNullOrEmpty(uri.Host))
                {
                    problems.Add(new($"{destination.Path}:Address", $"'{address}' is not an absolute http:// or https:// URL"));
                }
            }

            // YARP's HashCookie policy needs System.IO.Hashing, which this build cannot ship (see Directory.Packages.props).
            var policy = cluster["SessionAffinity:Policy"];
            if (string.Equals(policy, "HashCookie", StringComparison.OrdinalIgnoreCase))
            {
                problems.Add(new($"{cluster.Path}:SessionAffinity:Policy", "HashCookie is not supported by Tern; use Cookie or ArrCookie"));
            }
        }
    }
}
