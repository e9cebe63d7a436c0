using System.Buffers;
using Microsoft.AspNetCore.Http.Features;
using Yarp.ReverseProxy.Transforms;

namespace Tern.Proxy.Forwarding;

/// <summary>
/// The upstream gets the request's path and query as the client wrote them, as through nginx,
/// on routes that do not rewrite the path, or only remove a prefix from it (PathRemovePrefix:
/// /npm/@scope%2Fname reaches the upstream as /@scope%2Fname), add one (PathPrefix), or both,
/// or fill a PathPattern with its segments (<see cref="RawPattern"/>: /old/{**rest} to
/// /new/{**rest}, /api/{service}/{**rest} to /{service}/v1/{**rest}). A
/// route's Query* transforms still apply: its path goes as written, and its query as written but
/// for what they change (<see cref="RawQuery"/>).
/// </summary>
/// <remarks>
/// <para>
/// YARP builds the upstream's target from Kestrel's decoded path, escaped again. That is not the
/// client's: Kestrel leaves <c>%2F</c> encoded and YARP then escapes its <c>%</c>, so
/// <c>/a%2Fb</c> reached the upstream as <c>/a%252Fb</c> (an npm scoped package through Nexus,
/// GitLab's <c>projects/group%2Fproject</c>, RabbitMQ's vhost <c>%2F</c>: another resource, or a
/// 404); and <c>%3B</c>, <c>%2B</c>, <c>%26</c> arrived decoded, as <c>;</c>, <c>+</c>, <c>&amp;</c>,
/// which mean something else to a Java app, S3 or a signature over the path.
/// </para>
/// <para>
/// The client's target is used only where it means what Kestrel routed on: it is in origin form,
/// holds only characters a URI may hold (RFC 3986: no controls, spaces, quotes or backslashes),
/// and has no dot segment, plain or encoded (<c>.</c>, <c>..</c>, <c>%2e%2e</c>), which Kestrel
/// resolves before routing; any other request gets YARP's target, as before, so that the upstream
/// never resolves a path to somewhere other than where Tern routed it. The target is not parsed
/// again on the way (<see cref="UriCreationOptions.DangerousDisablePathAndQueryCanonicalization"/>):
/// .NET would otherwise unescape some of it. A removed prefix is removed from the client's target
/// when the target's path starts with it as written (in any case, as YARP compares it), and is
/// followed by a '/' or nothing; a prefix written with escapes (<c>/n%70m</c>) leaves YARP's target.
/// </para>
/// </remarks>
internal sealed class ClientTarget(Func<string, string?> path, bool queryRewritten) : RequestTransform
{
    // RFC 3986: unreserved, reserved (gen-delims without '#', sub-delims) and '%'.
    private static readonly SearchValues<char> s_uriChars =
        SearchValues.Create("!$%&'()*+,-./0123456789:;=?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[]_abcdefghijklmnopqrstuvwxyz~");

    private static readonly UriCreationOptions s_asWritten = new() { DangerousDisablePathAndQueryCanonicalization = true };

    /// <summary>
    /// The transform for a route whose path the client's target can make: one with no Path*
    /// transform, a PathRemovePrefix, a PathPrefix or both (see Prefixes), or a PathPattern filled
    /// from the client's segments (<see cref="RawPattern"/>); null for any other, whose every
    /// request gets YARP's target.
    /// </summary>
    public static ClientTarget? For(IReadOnlyList<IReadOnlyDictionary<string, string>> transforms, string? matchPath)
    {
        var queryRewritten = transforms.Any(t => t.Keys.Any(k => k.StartsWith("Query", StringComparison.OrdinalIgnoreCase)));
        if (PathTransforms(transforms) is [{ Key: var key, Value: var pattern }] && key.Equals("PathPattern", StringComparison.OrdinalIgnoreCase))
        {
            return RawPattern.For(pattern, matchPath) is { } filled ? new(filled.Fill, queryRewritten) : null;
        }

        return Prefixes(transforms) is var (removed, added) ? new(rest => Moved(rest, removed, added), queryRewritten) : null;
    }

    /// <summary>
    /// The prefix a route removes from the client's path and the one it adds before the rest ("" for
    /// none), where it rewrites the path no other way: no Path* transform, PathRemovePrefix,
    /// PathPrefix, or both; null for any other rewrite (a PathPattern is RawPattern's, both ways).
    /// PathPrefix's is added where it is written in URI characters YARP leaves as they are,
    /// without escapes or dot segments.
    /// </summary>
    private static (string Removed, string Added)? Prefixes(IReadOnlyList<IReadOnlyDictionary<string, string>> transforms) =>
        PathTransforms(transforms) switch
        {
            [] => ("", ""),
            [var remove] when Removes(remove) => (remove.Value, ""),
            [var add] when Added(add) is { } added => ("", added),
            [var remove, var add] when Removes(remove) && Added(add) is { } added => (remove.Value, added),
            _ => null,
        };

    /// <summary>
    /// How a path an upstream redirects to maps back to the client's, for a route that removes
    /// and adds these prefixes, as nginx's proxy_redirect default maps proxy_pass's URL back to the
    /// location's prefix: a path under Upstream goes under Client ("/" or "/app/"), and Upstream
    /// itself, with a query or fragment or neither, goes as Bare (no client path reaches it where
    /// Bare is null: a redirect there is left alone). For a route with another PathPattern, Pattern
    /// maps the upstream's whole path to the client's instead (<see cref="RawPattern.Inverse"/>).
    /// </summary>
    public sealed record Redirects(string Client, string Upstream, string? Bare, RawPattern? Pattern = null);

    /// <summary>The Redirects of a route with these transforms (see RedirectsFor and Redirects), or null where none can be told.</summary>
    public static Redirects? RedirectsOf(IReadOnlyList<IReadOnlyDictionary<string, string>> transforms, string? matchPath)
    {
        if (Prefixes(transforms) is var (removed, added) && RedirectsFor(removed, added, matchPath) is { } redirects)
        {
            return redirects;
        }

        return PathTransforms(transforms) is [{ Key: var key, Value: var pattern }] && key.Equals("PathPattern", StringComparison.OrdinalIgnoreCase)
            && RawPattern.Inverse(pattern, matchPath) is { } inverse
            ? new("/", "", null, inverse)
            : null;
    }

    /// <summary>
    /// The Redirects of a route with these prefixes, or null where none can be told. Without an
    /// added prefix, the upstream's paths are the client's but for the removed one, which is put back
    /// (/login is /app/login). With one, only a path under what the route's own paths become is
    /// the client's: where Match:Path is /old/{**rest} and /old is swapped for /v2, /v2/x is
    /// /old/x, and /v2 itself /old (not /old/, which reaches /v2/: an upstream that redirects /v2/
    /// to /v2 would send the client round); where /add/{**rest} only has /v3 added, /v3/add/x is
    /// /add/x, and /v3/x is no path of the route, left alone, as nginx does. A route with other
    /// parameters in Match:Path has no such prefix: null.
    /// </summary>
    internal static Redirects? RedirectsFor(string removed, string added, string? matchPath)
    {
        var client = removed.TrimEnd('/') + "/";
        if (added.Length == 0)
        {
            return new(client, "", client);
        }

        var literal = matchPath is null ? "" : CatchAllPrefix(matchPath) is var (prefix, _) ? prefix : null;
        if (literal is null || WithoutPrefix(literal, removed) is not { } kept)
        {
            return null;
        }

        return new(literal + "/", added.TrimEnd('/') + kept, literal.Length > 0 && (kept.Length > 0 || !added.EndsWith('/')) ? literal : null);
    }

    private static List<KeyValuePair<string, string>> PathTransforms(IReadOnlyList<IReadOnlyDictionary<string, string>> transforms) =>
        transforms.SelectMany(t => t).Where(p => p.Key.StartsWith("Path", StringComparison.OrdinalIgnoreCase)).ToList();

    /// <summary>A PathRemovePrefix the client's target can be compared with as written (one with an escape is YARP's to remove).</summary>
    private static bool Removes(KeyValuePair<string, string> transform) =>
        transform.Key.Equals("PathRemovePrefix", StringComparison.OrdinalIgnoreCase) && !transform.Value.Contains('%', StringComparison.Ordinal);

    /// <summary>The literal prefix of a pattern that ends with its only parameter, a catch-all '/{**name}' without a constraint or default, and that name.</summary>
    private static (string Prefix, string Name)? CatchAllPrefix(string pattern)
    {
        var start = pattern.IndexOf("/{**", StringComparison.Ordinal);
        if (start < 0 || !pattern.EndsWith('}') || pattern.AsSpan(0, start).IndexOfAny('{', '}') >= 0 || (start > 0 && pattern[0] != '/'))
        {
            return null;
        }

        var name = pattern[(start + 4)..^1];
        return name.Length > 0 && !name.Any(":=?{}*/".Contains) ? (pattern[..start], name) : null;
    }

    /// <summary>A PathPrefix as YARP makes it a path, where it can go as written (YARP escapes '[' and ']' in a path), or null.</summary>
    private static string? Added(KeyValuePair<string, string> transform)
    {
        if (!transform.Key.Equals("PathPrefix", StringComparison.OrdinalIgnoreCase))
        {
            return null;
        }

        var prefix = transform.Value.Length == 0 || transform.Value.StartsWith('/') ? transform.Value : "/" + transform.Value;
        return AsPath(prefix) ? prefix : null;
    }

    /// <summary>Whether a path written in configuration goes as written: URI characters but the ones YARP escapes in a path ('[', ']', '?') or that would start an escape ('%'), and no dot segment.</summary>
    internal static bool AsPath(string path) => AsWritten(path) && path.AsSpan().IndexOfAny("%?[]") < 0;

    public override ValueTask ApplyAsync(RequestTransformContext context)
    {
        var target = context.HttpContext.Features.Get<IHttpRequestFeature>()?.RawTarget;
        if (target is { Length: > 0 } && target[0] == '/' && !context.HttpContext.Request.PathBase.HasValue && AsWritten(target))
        {
            var end = target.IndexOf('?', StringComparison.Ordinal);
            if (path(end < 0 ? target : target[..end]) is not { } sent)
            {
                return ValueTask.CompletedTask;
            }

            var query = end < 0 ? "" : target[end..];
            if (queryRewritten)
            {
                // The client's query with what the route's Query* transforms changed, and only that.
                query = RawQuery.Edited(query, context.HttpContext.Request.Query, context.Query.Collection) ?? context.Query.QueryString.ToUriComponent();
            }

            var prefix = context.DestinationPrefix.AsSpan();
            if (prefix.EndsWith('/'))
            {
                prefix = prefix[..^1];
            }

            context.ProxyRequest.RequestUri = new Uri(string.Concat(prefix, sent, query), in s_asWritten);
        }

        return ValueTask.CompletedTask;
    }

    /// <summary>
    /// The client's path without the removed prefix and with the added one, as YARP joins them: the
    /// added prefix before the path left, one '/' between them; the prefix whole where nothing is
    /// left (a prefix removed whole), and '/' for neither. Null where the path does not start with
    /// the removed prefix as written.
    /// </summary>
    private static string? Moved(string path, string removed, string added)
    {
        if (WithoutPrefix(path, removed) is not { } rest)
        {
            return null;
        }

        return rest.Length == 0 ? (added.Length > 0 ? added : "/") : string.Concat(added.EndsWith('/') ? added[..^1] : added, rest);
    }

    /// <summary>The target without the removed prefix, or null where it does not start with it as a whole segment.</summary>
    private static string? WithoutPrefix(string target, string prefix)
    {
        if (prefix.Length == 0)
        {
            return target;
        }

        return target.StartsWith(prefix, StringComparison.OrdinalIgnoreCase) && (target.Length == prefix.Length || target[prefix.Length] == '/')
            ? target[prefix.Length..]
            : null;
    }

    /// <summary>Whether the target can go as written: URI characters only, and no dot segment in its path.</summary>
    internal static bool AsWritten(string target)
    {
        if (target.AsSpan().IndexOfAnyExcept(s_uriChars) >= 0)
        {
            return false;
        }

        var query = target.IndexOf('?', StringComparison.Ordinal);
        var path = query < 0 ? target.AsSpan() : target.AsSpan(0, query);
        while (path.Length > 0)
        {
            path = path[1..]; // past the '/'
            var end = path.IndexOf('/');
            if (IsDotSegment(end < 0 ? path : path[..end]))
            {
                return false;
            }

            path = end < 0 ? [] : path[end..];
        }

        return true;
    }

    /// <summary>"." or "..", each dot written as itself or as %2e.</summary>
    private static bool IsDotSegment(ReadOnlySpan<char> segment)
    {
        var dots = 0;
        while (segment.Length > 0)
        {
            if (segment[0] == '.')
            {
                segment = segment[1..];
            }
            else if (segment.StartsWith("%2e", StringComparison.OrdinalIgnoreCase))
            {
                segment = segment[3..];
            }
            else
            {
                return false;
            }

            dots++;
        }

        return dots is 1 or 2;
    }
}
