using Microsoft.AspNetCore.Routing.Patterns;
using Microsoft.Extensions.Configuration;

namespace Tern.Proxy.Configuration;

/// <summary>
/// Finds routes that ASP.NET Core's routing could not choose between. Two routes with the same
/// Order, the same path pattern and the same other matches both match a request, and the router
/// then throws on it: every such request was a 500, with an error and a stack trace in the log,
/// and YARP accepted the configuration. The usual way in: a route of one's own over every path,
/// added beside the shipped <c>default</c> under another name.
/// </summary>
/// <remarks>
/// Only what certainly collides is refused, so a working configuration is never refused:
/// patterns that differ only in parameter names, defaults, optional marks, letter case or a
/// trailing slash (<c>/d/{x=v}</c> and <c>/d/{y}</c> collide on <c>/d/q</c>); Hosts that are
/// both absent, the same list, or share a name written alike where neither list has a wildcard or
/// a port; Methods both absent or sharing one; Headers and QueryParameters both absent or written
/// alike. Routes that overlap in some other way (a constrained parameter beside a plain one, a
/// host beside no host or beside the same host in other letters) are ranked by the router, not
/// ambiguous. DuplicateRoutesTests holds each case against the router's own verdict.
/// </remarks>
internal static class DuplicateRoutes
{
    public static void Check(IEnumerable<IConfigurationSection> routes, List<ConfigurationProblem> problems)
    {
        // Grouped by what must be equal, so that 2,000 routes cost 2,000 lookups, not 2 million pairs.
        var seen = new Dictionary<(int, string, string, string), List<(string Name, Shape Shape)>>();
        foreach (var route in routes)
        {
            if (Read(route) is not { } shape)
            {
                continue; // YARP's own validation names what is wrong with it
            }

            var key = (shape.Order, shape.Path, shape.Headers, shape.Query);
            if (!seen.TryGetValue(key, out var alike))
            {
                seen[key] = alike = [];
            }

            if (alike.FirstOrDefault(other => shape.Collides(other.Shape)).Name is { } name)
            {
                problems.Add(new($"{route.Path}:Match", $"matches the same requests as route '{name}' (the same Path, Hosts, Methods, Headers, QueryParameters and Order), so the router could choose neither and would answer each of them 500; remove one, change its Match, or give the one that should win a lower Order"));
            }

            alike.Add((route.Key, shape));
        }
    }

    private static Shape? Read(IConfigurationSection route)
    {
        var order = 0;
        if (route["Order"] is { } text && !int.TryParse(text, out order))
        {
            return null;
        }

        var match = route.GetSection("Match");
        RoutePattern pattern;
        try
        {
            // YARP matches every path when a route gives only Hosts.
            pattern = RoutePatternFactory.Parse(match["Path"] is { Length: > 0 } path ? path : "/{**catchall}");
        }
        catch (RoutePatternException)
        {
            return null;
        }

        // The router compares host names as written (a.test and A.TEST rank apart), methods without case.
        return new Shape(order, Canonical(pattern), List(match.GetSection("Hosts"), StringComparer.Ordinal), List(match.GetSection("Methods"), StringComparer.OrdinalIgnoreCase),
            Flat(match.GetSection("Headers")), Flat(match.GetSection("QueryParameters")));
    }

    /// <summary>The pattern as the router ranks it: parameters without their names, defaults or optional marks, literals without case.</summary>
    private static string Canonical(RoutePattern pattern) => string.Join("/", pattern.PathSegments.Select(segment => string.Concat(segment.Parts.Select(part => part switch
    {
        RoutePatternLiteralPart literal => "L" + literal.Content.ToUpperInvariant(),
        RoutePatternSeparatorPart separator => "S" + separator.Content,
        // A default or an optional mark widens what a parameter matches without ranking it apart:
        // both patterns still match the requests they share, and collide on those.
        RoutePatternParameterPart parameter => "{" + (parameter.IsCatchAll ? "*" : "") + string.Concat(parameter.ParameterPolicies.Select(p => ":" + p.Content)) + "}",
        _ => "?" + part,
    }))));

    private static HashSet<string> List(IConfigurationSection section, StringComparer comparer) => section.Value is { } one
        ? new([one], comparer)
        : new(section.GetChildren().Select(c => c.Value ?? ""), comparer);

    private static string Flat(IConfigurationSection section) =>
        string.Join("\n", section.AsEnumerable(makePathsRelative: true).Where(p => p.Value is not null).OrderBy(p => p.Key, StringComparer.OrdinalIgnoreCase).Select(p => p.Key + "=" + p.Value));

    private sealed record Shape(int Order, string Path, HashSet<string> Hosts, HashSet<string> Methods, string Headers, string Query)
    {
        /// <summary>Whether both match some request alike, given the same Order, Path, Headers and QueryParameters.</summary>
        public bool Collides(Shape other) =>
            HostsCollide(Hosts, other.Hosts) && (Methods.Count == 0 ? other.Methods.Count == 0 : Methods.Overlaps(other.Methods));

        private static bool HostsCollide(HashSet<string> a, HashSet<string> b) =>
            a.SetEquals(b) || (a.Overlaps(b) && !a.Concat(b).Any(h => h.Contains('*') || h.Contains(':')));
    }
}
