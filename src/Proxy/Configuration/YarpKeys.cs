namespace Tern.Proxy.Configuration;

/// <summary>
/// The keys YARP 2.1's configuration reader reads under ReverseProxy (its
/// ConfigurationConfigProvider, which asks for each by name). Any other key is dropped by YARP
/// without a word: a misspelt "ActivityTimout" left the cluster on YARP's 100 s, a health check's
/// "Query" (a later YARP's) probed without it. Tern names each as ignored, with the name YARP
/// reads where one is close.
/// </summary>
internal static class YarpKeys
{
    /// <summary>A node of the key tree: named children, children of any name (routes, indexes, metadata), or a value.</summary>
    private sealed class Node(Dictionary<string, Node>? named = null, Node? any = null)
    {
        public Dictionary<string, Node>? Named { get; } = named;

        public Node? Any { get; } = any;

        public bool IsValue => Named is null && Any is null;
    }

    private static readonly Node Value = new();

    private static Node Of(params (string Name, Node Node)[] children) =>
        new(children.ToDictionary(c => c.Name, c => c.Node, StringComparer.OrdinalIgnoreCase));

    private static Node AnyName(Node child) => new(any: child);

    private static (string, Node)[] Values(params string[] names) => [.. names.Select(n => (n, Value))];

    private static readonly Node Root = BuildRoot();

    private static Node BuildRoot()
    {
        var matchEntry = Of(Values("Name", "Mode", "IsCaseSensitive").Append(("Values", AnyName(Value))).ToArray());
        var route = Of(
        [
            // RouteId: YARP throws on it (ids are the keys now), and says so. OutputCachePolicy:
            // not read by YARP 2.1, refused by ReverseProxyValidator with its own reason.
            .. Values("RouteId", "Order", "MaxRequestBodySize", "ClusterId", "AuthorizationPolicy", "RateLimiterPolicy", "TimeoutPolicy", "Timeout", "CorsPolicy", "OutputCachePolicy"),
            ("Metadata", AnyName(Value)),
            ("Transforms", AnyName(AnyName(Value))),
            ("Match", Of(("Path", Value), ("Methods", AnyName(Value)), ("Hosts", AnyName(Value)), ("Headers", AnyName(matchEntry)), ("QueryParameters", AnyName(matchEntry)))),
        ]);
        var cluster = Of(
            ("LoadBalancingPolicy", Value),
            ("SessionAffinity", Of(
            [
                .. Values("Enabled", "Policy", "FailurePolicy", "AffinityKeyName"),
                ("Cookie", Of(Values("Path", "Domain", "HttpOnly", "SecurePolicy", "SameSite", "Expiration", "MaxAge", "IsEssential"))),
            ])),
            ("HealthCheck", Of(
                ("Active", Of(Values("Enabled", "Interval", "Timeout", "Policy", "Path"))),
                ("Passive", Of(Values("Enabled", "Policy", "ReactivationPeriod"))),
                ("AvailableDestinationsPolicy", Value))),
            ("HttpClient", Of(
            [
                .. Values("DangerousAcceptAnyServerCertificate", "MaxConnectionsPerServer", "EnableMultipleHttp2Connections", "RequestHeaderEncoding", "ResponseHeaderEncoding"),
                ("SslProtocols", AnyName(Value)),
                ("WebProxy", Of(Values("Address", "BypassOnLocal", "UseDefaultCredentials"))),
            ])),
            ("HttpRequest", Of(Values("ActivityTimeout", "Version", "VersionPolicy", "AllowResponseBuffering"))),
            ("Metadata", AnyName(Value)),
            ("Destinations", AnyName(Of(("Address", Value), ("Health", Value), ("Host", Value), ("Metadata", AnyName(Value))))));
        return Of(("Routes", AnyName(route)), ("Clusters", AnyName(cluster)));
    }

    /// <summary>
    /// The keys of these ReverseProxy values that YARP does not read: each named once, at the
    /// first part YARP does not know (ReverseProxy:Clusters:app:Destinatons, not each key under
    /// it), or a section given a value of its own.
    /// </summary>
    public static IEnumerable<UnreadSetting> Unread(IEnumerable<KeyValuePair<string, string?>> values)
    {
        var named = new HashSet<string>(StringComparer.OrdinalIgnoreCase);
        foreach (var (key, value) in values)
        {
            if (Find(key, string.IsNullOrEmpty(value)) is { } unread && named.Add(unread.Key))
            {
                yield return unread;
            }
        }
    }

    private static UnreadSetting? Find(string key, bool empty)
    {
        var parts = key.Split(':');
        var node = Root;
        for (var i = 1; i < parts.Length; i++)
        {
            var next = node.Named?.GetValueOrDefault(parts[i]) ?? node.Any;
            if (next is null)
            {
                return new(string.Join(':', parts[..(i + 1)]), false, Hint(node, parts[i]));
            }

            node = next;
        }

        // An empty value is how JSON's empty object or array ({} or []) arrives: nothing given.
        return node.IsValue || empty ? null : new(key, true, null);
    }

    /// <summary>Where YARP reads a name like this one: the same name one level down (a route's Path is Match:Path), or a sibling spelt nearly the same.</summary>
    private static string? Hint(Node node, string part)
    {
        if (node.Named is null)
        {
            return null; // under a value (Transforms:0:Set:x): nothing is read there
        }

        foreach (var (name, child) in node.Named)
        {
            if (child.Named?.Keys.FirstOrDefault(k => k.Equals(part, StringComparison.OrdinalIgnoreCase)) is { } under)
            {
                return $"{name}:{under}";
            }

            if (child.Any?.Named?.Keys.FirstOrDefault(k => k.Equals(part, StringComparison.OrdinalIgnoreCase)) is { } deeper)
            {
                return $"{name}:<name>:{deeper}";
            }
        }

        // One slip in a short name, two in a longer one: Pth, ActivityTimout, Destinatons.
        return node.Named.Keys
            .Select(name => (name, distance: Distance(name.ToUpperInvariant(), part.ToUpperInvariant())))
            .Where(c => c.distance <= (c.name.Length >= 6 ? 2 : 1))
            .OrderBy(c => c.distance)
            .Select(c => c.name)
            .FirstOrDefault();
    }

    /// <summary>Levenshtein distance (edits of one character).</summary>
    private static int Distance(string a, string b)
    {
        var previous = new int[b.Length + 1];
        var current = new int[b.Length + 1];
        for (var j = 0; j <= b.Length; j++)
        {
            previous[j] = j;
        }

        for (var i = 1; i <= a.Length; i++)
        {
            current[0] = i;
            for (var j = 1; j <= b.Length; j++)
            {
                current[j] = Math.Min(Math.Min(current[j - 1], previous[j]) + 1, previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1));
            }

            (previous, current) = (current, previous);
        }

        return previous[b.Length];
    }
}
