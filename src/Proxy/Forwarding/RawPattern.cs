using System.Text;
using System.Text.Encodings.Web;
using Microsoft.AspNetCore.Routing.Patterns;
using Tern.Proxy.Configuration;

namespace Tern.Proxy.Forwarding;

/// <summary>
/// A route's PathPattern filled with the client's path segments as written. YARP fills it with
/// the route values, which Kestrel decoded (all but <c>%2F</c>), and escapes them again: with
/// Match:Path <c>/api/{service}/{**rest}</c> and PathPattern <c>/{service}/v1/{**rest}</c>,
/// <c>/api/npm/@scope%2Fname</c> reached the upstream as <c>/npm/v1/@scope%252Fname</c>
/// (dotnet/yarp#1419) and <c>%3B</c> as <c>;</c>. Each value here is the segment, or for a
/// catch-all the segments, it was read from. The pattern's literals go as a PathPrefix goes, as
/// written, where they hold only characters a path may (<c>/v1:beta</c>), and escaped as YARP
/// escapes them where not (<c>/café</c> as <c>/caf%C3%A9</c>).
/// </summary>
/// <remarks>
/// Kestrel decodes every escape but <c>%2F</c>, so the client's path and the one routed on have
/// the same '/' between the same segments, and a Match:Path segment is the path's segment at its
/// place (ClientTarget leaves out targets with dot segments, which Kestrel resolves). A parameter
/// is taken from the target only where it is a segment of its own in both patterns, with no
/// default and not optional in the PathPattern; a catch-all the Match:Path catches whole must be
/// one written <c>{**name}</c> in the PathPattern (a one-segment <c>{name}</c> would have its '/'
/// escaped). Any other pattern, and a request whose segment for a parameter is missing or empty
/// (a default, or an optional one, filled in), gets YARP's target. Where the client ends the
/// catch-all's segments with a '/', so does the path sent (<c>/api/npm/</c> to <c>/npm/v1/</c>,
/// where YARP sent <c>/npm/v1</c>), as a prefix swapped through nginx's proxy_pass does.
/// </remarks>
internal sealed class RawPattern
{
    /// <summary>A segment of the pattern: literal text, escaped, or the index of the client's segment that fills it (a catch-all: it and all after).</summary>
    private readonly record struct Piece(string? Literal, int Segment, bool CatchAll);

    private readonly Piece[] _pieces;

    private RawPattern(Piece[] pieces) => _pieces = pieces;

    /// <summary>The PathPattern as filled from the client's path, or null where YARP's filling must stand (see the remarks).</summary>
    public static RawPattern? For(string pattern, string? matchPath)
    {
        if (ReverseProxyValidator.Parse(pattern) is not { } parsed || (matchPath is null ? RoutePatternFactory.Parse("/") : ReverseProxyValidator.Parse(matchPath)) is not { } match)
        {
            return null;
        }

        // Where each Match:Path parameter that is a segment of its own stands.
        var places = new Dictionary<string, (int Segment, bool CatchAll)>(StringComparer.OrdinalIgnoreCase);
        for (var i = 0; i < match.PathSegments.Count; i++)
        {
            if (match.PathSegments[i] is { IsSimple: true, Parts: [RoutePatternParameterPart parameter] })
            {
                places[parameter.Name] = (i, parameter.IsCatchAll);
            }
        }

        var pieces = new List<Piece>();
        foreach (var segment in parsed.PathSegments)
        {
            switch (segment.Parts)
            {
                case [RoutePatternLiteralPart literal]:
                    pieces.Add(new(ClientTarget.AsPath("/" + literal.Content) ? literal.Content : UrlEncoder.Default.Encode(literal.Content), 0, false));
                    break;
                case [RoutePatternParameterPart { IsOptional: false, Default: null } parameter]
                    when places.TryGetValue(parameter.Name, out var place) && (!place.CatchAll || parameter is { IsCatchAll: true, EncodeSlashes: false }):
                    pieces.Add(new(null, place.Segment, place.CatchAll));
                    break;
                default:
                    return null;
            }
        }

        return new([.. pieces]);
    }

    /// <summary>The path for the client's path as written (starting with '/', without the query), or null where a parameter's segment is missing or empty.</summary>
    public string? Fill(string path)
    {
        var segments = path[1..].Split('/');
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

        return filled.Length == 0 ? "/" : filled.ToString();
    }
}
