using System.Buffers;
using System.Text;
using Microsoft.AspNetCore.Routing.Patterns;
using Tern.Proxy.Configuration;

namespace Tern.Proxy.Forwarding;

/// <summary>
/// A route's PathPattern filled with the client's path segments as written. YARP fills it with
/// the route values, which Kestrel decoded (all but <c>%2F</c>), and escapes them again: with
/// Match:Path <c>/api/{service}/{**rest}</c> and PathPattern <c>/{service}/v1/{**rest}</c>,
/// <c>/api/npm/@scope%2Fname</c> reached the upstream as <c>/npm/v1/@scope%252Fname</c>
/// (dotnet/yarp#1419) and <c>%3B</c> as <c>;</c>. Each value here is the segment, or for a
/// catch-all the segments, it was read from. The pattern's literals go as YARP writes them: what a
/// path may hold as written (<c>/v1:beta</c>), the rest escaped (<c>/C++ docs</c> as
/// <c>/C++%20docs</c>).
/// </summary>
/// <remarks>
/// Kestrel decodes every escape but <c>%2F</c>, so the client's path and the one routed on have
/// the same '/' between the same segments, and a Match:Path segment is the path's segment at its
/// place (ClientTarget leaves out targets with dot segments, which Kestrel resolves). A parameter
/// is taken from the target only where it is a segment of its own in both patterns, with no
/// default and not optional in the PathPattern; a catch-all the Match:Path catches whole must be
/// one written <c>{**name}</c> in the PathPattern (a one-segment <c>{name}</c> would have its '/'
/// escaped). Any other pattern, and a request whose segment for a parameter is missing or empty
/// (a default, or an optional one, filled in), gets YARP's target, as does a pattern with a
/// literal dot segment (which YARP's Uri resolves) and a request whose path would start with
/// '//' (<c>/api//x</c> for <c>/api/{**rest}</c> to <c>/{**rest}</c>: YARP sends <c>/x</c>, and
/// an upstream that redirects to <c>//x</c> sends the client to the host x). Where the client ends the
/// catch-all's segments with a '/', so does the path sent (<c>/api/npm/</c> to <c>/npm/v1/</c>,
/// where YARP sent <c>/npm/v1</c>), as a prefix swapped through nginx's proxy_pass does.
/// </remarks>
internal sealed class RawPattern
{
    /// <summary>A segment of the pattern: literal text, escaped, or the index of the client's segment that fills it (a catch-all: it and all after).</summary>
    private readonly record struct Piece(string? Literal, int Segment, bool CatchAll);

    private readonly Piece[] _pieces;

    /// <summary>The segments the path must hold as written, by index (<see cref="Inverse"/>: the literals Tern sent).</summary>
    private readonly (int Segment, string Text)[] _literals;

    /// <summary>How many segments the path must have, or, negated and less one, at least how many (a catch-all after them); null for any.</summary>
    private readonly int? _count;

    private RawPattern(Piece[] pieces, (int, string)[] literals, int? count) => (_pieces, _literals, _count) = (pieces, literals, count);

    /// <summary>The PathPattern as filled from the client's path, or null where YARP's filling must stand (see the remarks).</summary>
    public static RawPattern? For(string pattern, string? matchPath) => Build(AsPath(pattern), MatchOf(matchPath), inverse: false);

    /// <summary>
    /// The other way, for a redirect: the client's path for a path of the upstream's that the
    /// PathPattern makes, its values taken from where the PathPattern puts them and put where
    /// Match:Path reads them (<c>/npm/v1/login</c> to <c>/api/npm/login</c> for the route above).
    /// Null where Match:Path has a value the PathPattern does not carry, or where For is (the
    /// upstream got YARP's paths); Fill is null for a path whose literals are not the PathPattern's as
    /// Tern writes them, or whose segments are too many or too few.
    /// </summary>
    public static RawPattern? Inverse(string pattern, string? matchPath) =>
        For(pattern, matchPath) is null ? null : Build(MatchOf(matchPath), AsPath(pattern), inverse: true);

    // As YARP makes the pattern a path first: ~/x is the literal ~ then x, not the root's x.
    private static string AsPath(string pattern) => pattern.StartsWith('/') ? pattern : "/" + pattern;

    private static string MatchOf(string? matchPath) => string.IsNullOrEmpty(matchPath) ? ReverseProxyValidator.EveryPath : matchPath;

    /// <summary>A pattern to fill, from the path a second pattern matched (the client's path and Match:Path, or, inverse, the upstream's and the PathPattern).</summary>
    private static RawPattern? Build(string fill, string from, bool inverse)
    {
        if (ReverseProxyValidator.Parse(fill) is not { } filled || ReverseProxyValidator.Parse(from) is not { } source)
        {
            return null;
        }

        // Where each parameter of the matched pattern that is a segment of its own stands; for the
        // inverse, which of its literals the path must hold (the router checked the client's).
        var places = new Dictionary<string, (int Segment, bool CatchAll)>(StringComparer.OrdinalIgnoreCase);
        var literals = new List<(int, string)>();
        var count = source.PathSegments.Count;
        for (var i = 0; i < source.PathSegments.Count; i++)
        {
            switch (source.PathSegments[i].Parts)
            {
                case [RoutePatternParameterPart parameter]:
                    places[parameter.Name] = (i, parameter.IsCatchAll);
                    count = parameter.IsCatchAll ? -i - 1 : count;
                    break;
                case [RoutePatternLiteralPart literal] when inverse:
                    literals.Add((i, Escaped(literal.Content)));
                    break;
                case var _ when inverse:
                    return null; // a segment whose parts For leaves to YARP: Tern never sent it
            }
        }

        var pieces = new List<Piece>();
        foreach (var segment in filled.PathSegments)
        {
            switch (segment.Parts)
            {
                case [RoutePatternLiteralPart { Content: not ("." or "..") } literal]: // YARP's Uri resolves a dot segment
                    pieces.Add(new(Escaped(literal.Content), 0, false));
                    break;
                case [RoutePatternParameterPart { IsOptional: false, Default: null } parameter]
                    when places.TryGetValue(parameter.Name, out var place) && (!place.CatchAll || parameter is { IsCatchAll: true } && (inverse || !parameter.EncodeSlashes)):
                    pieces.Add(new(null, place.Segment, place.CatchAll));
                    break;
                default:
                    return null;
            }
        }

        return new([.. pieces], [.. literals], inverse ? count : null);
    }

    /// <summary>The path for the client's path as written (starting with '/', without the query), or null where a parameter's segment is missing or empty.</summary>
    public string? Fill(string path)
    {
        var segments = path[1..].Split('/');
        if (_count is { } count && (count >= 0 ? segments.Length != count : segments.Length < -count - 1))
        {
            return null;
        }

        foreach (var (segment, text) in _literals)
        {
            if (!string.Equals(segments[segment], text, StringComparison.Ordinal))
            {
                return null;
            }
        }

        var filled = new StringBuilder(path.Length + 16);
        foreach (var piece in _pieces)
        {
            if (piece.Literal is { } literal)
            {
                filled.Append('/').Append(literal);
            }
            else if (piece.CatchAll)
            {
                if (piece.Segment < segments.Length)
                {
                    filled.Append('/').Append(string.Join('/', segments, piece.Segment, segments.Length - piece.Segment));
                }
            }
            else if (piece.Segment < segments.Length && segments[piece.Segment].Length > 0)
            {
                filled.Append('/').Append(segments[piece.Segment]);
            }
            else
            {
                return null;
            }
        }

        // A path that starts '//' reads as another host to an upstream that redirects to it (YARP's
        // binder sends one '/' where the values start with an empty segment: /api//x as /x).
        return filled.Length == 0 ? "/" : filled.Length > 1 && filled[1] == '/' ? null : filled.ToString();
    }

    /// <summary>A literal as YARP writes it in a path: each run of characters a path may not hold as is (RFC 3986's pchar) escaped as UTF-8, the rest as written.</summary>
    private static string Escaped(string literal)
    {
        var escaped = new StringBuilder();
        var rest = literal.AsSpan();
        while (rest.IndexOfAnyExcept(s_pathChars) is >= 0 and var start)
        {
            var length = rest[start..].IndexOfAny(s_pathChars) is >= 0 and var end ? end : rest.Length - start;
            escaped.Append(rest[..start]).Append(Uri.EscapeDataString(rest.Slice(start, length)));
            rest = rest[(start + length)..];
        }

        return escaped.Append(rest).ToString();
    }

    // RFC 3986's pchar but for '%', which starts an escape: unreserved, sub-delims, ':' and '@'.
    private static readonly SearchValues<char> s_pathChars =
        SearchValues.Create("!$&'()*+,-.0123456789:;=@ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz~");
}
