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
    /// <summary>A node of the key tree: named children, children of any name (routes, metadata) or a list's items (0, 1, ...), or a value.</summary>
    private sealed class Node(Dictionary<string, Node>? named = null, Node? any = null, bool list = false)
    {
        public Dictionary<string, Node>? Named { get; } = named;

        public Node? Any { get; } = any;

        public bool List { get; } = list;

        public bool IsValue => Named is null && Any is null;
    }

    private static readonly Node Value = new();

    private static Node Of(params (string Name, Node Node)[] children) =>
        new(children.ToDictionary(c => c.Name, c => c.Node, StringComparer.OrdinalIgnoreCase));

    private static Node AnyName(Node child) => new(any: child);

    private static Node ListOf(Node item) => new(any: item, list: true);

    private static (string, Node)[] Values(params string[] names) => [.. names.Select(n => (n, Value))];

    private static readonly Node Root = BuildRoot();

    private static Node BuildRoot()
    {
        var matchEntry = Of(Values("Name", "Mode", "IsCaseSensitive").Append(("Values", ListOf(Value))).ToArray());
        var route = Of(
        [
            // RouteId: YARP throws on it (ids are the keys now), and says so. OutputCachePolicy:
            // not read by YARP 2.1, refused by ReverseProxyValidator with its own reason.
            .. Values("RouteId", "Order", "MaxRequestBodySize", "ClusterId", "AuthorizationPolicy", "RateLimiterPolicy", "TimeoutPolicy", "Timeout", "CorsPolicy", "OutputCachePolicy"),
            ("Metadata", AnyName(Value)),
            ("Transforms", ListOf(AnyName(Value))),
            ("Match", Of(("Path", Value), ("Methods", ListOf(Value)), ("Hosts", ListOf(Value)), ("Headers", ListOf(matchEntry)), ("QueryParameters", ListOf(matchEntry)))),
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
                ("SslProtocols", ListOf(Value)),
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
        var found = new List<UnreadSetting>();
        var held = new Dictionary<string, System.Text.StringBuilder>(StringComparer.OrdinalIgnoreCase);
        foreach (var (key, value) in values)
        {
            if (Find(key, string.IsNullOrEmpty(value)) is not { } unread)
            {
                continue;
            }

            if (!held.TryGetValue(unread.Key, out var under))
            {
                found.Add(unread);
                held[unread.Key] = under = new();
            }

            under.Append(key).Append('=').Append(value).Append('\n');
        }

        return found.Select(u => u with { Value = held[u.Key].ToString() });
    }

    /// <summary>
    /// Whether an unread key is in a route's Match: there, what YARP drops leaves the route
    /// matching other requests than written, most often more (a misspelt "Host" matches every
    /// host, Hosts given one value rather than a list likewise), so it is a problem, not a warning.
    /// </summary>
    public static bool InMatch(string key) =>
        key.Split(':') is [_, var routes, _, var match, ..] && routes.Equals("Routes", StringComparison.OrdinalIgnoreCase) && match.Equals("Match", StringComparison.OrdinalIgnoreCase);

    private static UnreadSetting? Find(string key, bool empty)
    {
        var parts = key.Split(':');
        var node = Root;
        Node? parent = null;
        for (var i = 1; i < parts.Length; i++)
        {
            if (node.IsValue)
            {
                return NotRead(string.Join(':', parts[..(i + 1)]), $"{string.Join(':', parts[..i])} takes a value, not settings under it");
            }

            var next = node.Named?.GetValueOrDefault(parts[i]) ?? node.Any;
            if (next is null)
            {
                return NotRead(string.Join(':', parts[..(i + 1)]), Hint(node, parts[i]) switch
                {
                    null => "misspelt, or a setting of a later YARP?",
                    var hint when hint.Contains(':', StringComparison.Ordinal) => $"YARP reads it as {hint} under {string.Join(':', parts[..i])}",
                    var hint => $"misspelt? YARP reads {hint}",
                });
            }

            (parent, node) = (node, next);
        }

        // A route's or a cluster's metadata (ReverseProxy:Routes:r:Metadata:name), or a destination's.
        var (owner, metadata, name) = parts switch
        {
            [_, var kind, _, var section, var last] => (kind, section, last),
            [_, _, _, var kind, _, var section, var last] => (kind, section, last),
            _ => ("", "", ""),
        };
        if (metadata.Equals("Metadata", StringComparison.OrdinalIgnoreCase) && MetadataNotRead(owner, name) is { } why)
        {
            return new(key, UnreadSetting.Kinds.NotYarp, $"is not read by Tern or YARP and is ignored ({why})");
        }

        // An empty value is how JSON's empty object or array ({} or []) arrives: nothing given.
        if (node.IsValue || empty)
        {
            return null;
        }

        var list = key[..Math.Max(key.LastIndexOf(':'), 0)];
        var (what, instead) = node.List ? ("a list", $"give its items as {key}:0, {key}:1, ... (environment: {UnreadSetting.Environment(key)}__0, ...)")
            : parent is { List: true } ? ($"an item of the list {list}, a section", $"write {list}:0:{parts[^1]} (environment: {UnreadSetting.Environment(list)}__0__{parts[^1]})")
            : ("a section, not a setting", UnreadSetting.SettingsUnder(key));
        return new(key, UnreadSetting.Kinds.GivenToSection, InMatch(key)
            ? $"is {what}: YARP would ignore the value given to it, and the route would not match as written; {instead}"
            : $"is {what}: the value given to it is ignored; {instead}");
    }

    private static UnreadSetting NotRead(string key, string why) => InMatch(key)
        ? new(key, UnreadSetting.Kinds.NotYarp, $"is not read by YARP 2.1 ({why}), so the route would not match as written")
        : new(key, UnreadSetting.Kinds.NotYarp, $"is not read by YARP 2.1 and is ignored ({why})");

    /// <summary>The metadata names Tern and YARP read from a route's and a cluster's Metadata (none from a destination's).</summary>
    private static readonly Dictionary<string, string[]> ReadMetadata = new(StringComparer.OrdinalIgnoreCase)
    {
        ["Routes"] = [ReverseProxyValidator.AllowPlainHttpMetadata],
        ["Clusters"] = [.. ReverseProxyValidator.DurationMetadata, .. ReverseProxyValidator.HealthPolicyMetadata.Select(m => m.Name)],
        ["Destinations"] = [],
    };

    /// <summary>
    /// Why a metadata name Tern and YARP do not read where it is given looks meant for them, or null:
    /// a name one of them reads elsewhere (Tern.ConnectTimeout on a route), one a slip or three away
    /// from one read here (Tern.ConnectTimout, ConsecutiveFailureHealthPolicy.Threshold), or one
    /// under their prefixes (Tern., TransportFailureRateHealthPolicy.). Other names are the operator's own.
    /// </summary>
    private static string? MetadataNotRead(string kind, string name)
    {
        if (!ReadMetadata.TryGetValue(kind, out var here) || here.Contains(name, StringComparer.OrdinalIgnoreCase))
        {
            return null;
        }

        static string Owner(string kind) => kind.ToUpperInvariant() switch { "ROUTES" => "route", "CLUSTERS" => "cluster", _ => "destination" };
        foreach (var (where, names) in ReadMetadata)
        {
            if (names.FirstOrDefault(n => n.Equals(name, StringComparison.OrdinalIgnoreCase)) is { } elsewhere)
            {
                return $"{elsewhere} is read from a {Owner(where)}'s Metadata, not a {Owner(kind)}'s";
            }
        }

        var close = here.Select(n => (Name: n, Distance: Distance(n.ToUpperInvariant(), name.ToUpperInvariant()))).OrderBy(c => c.Distance).FirstOrDefault();
        if (close.Name is not null && close.Distance <= 3)
        {
            return $"misspelt? a {Owner(kind)}'s Metadata is read for {close.Name}";
        }

        var dot = name.IndexOf('.', StringComparison.Ordinal);
        return dot > 0 && ReadMetadata.Values.SelectMany(n => n).Any(n => n.StartsWith(name[..(dot + 1)], StringComparison.OrdinalIgnoreCase))
            ? here.Length == 0 ? $"nothing is read from a {Owner(kind)}'s Metadata" : $"a {Owner(kind)}'s Metadata is read for {string.Join(", ", here)}"
            : null;
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
