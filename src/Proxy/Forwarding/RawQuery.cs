using System.Text.Encodings.Web;
using Microsoft.AspNetCore.Http;
using Microsoft.Extensions.Primitives;

namespace Tern.Proxy.Forwarding;

/// <summary>
/// The client's query with only what a route's Query* transforms changed. YARP lets them edit
/// the query as decoded values and, once one has looked, builds the whole query anew from those:
/// every other parameter went escaped its own way (a client's <c>a+b</c> as <c>a%20b</c>, <c>%41</c> as
/// <c>A</c>, <c>flag</c> as <c>flag=</c>), and repeated names side by side, which breaks a signature
/// over the query (an S3 or CDN signed URL) and an app that reads order or <c>+</c>. Here the
/// parameters a transform left alone go as written, in place; a removed name's are left out; a
/// changed one's values are written, escaped as YARP escapes them, where the name first stood; and
/// appended values, and new names, go at the end. A query with a ';' goes as YARP rebuilt it: some upstreams (Rack 2, Go before 1.17, older Python) split parameters on ';'
/// too, so in ?keep=1;drop=1 they would read the drop a route removes, which YARP's rebuild sent as
/// drop%3D1, a name without a value.
/// </summary>
internal static class RawQuery
{
    /// <summary>
    /// The query (empty, or starting with '?') edited as <paramref name="edited"/> differs from
    /// <paramref name="original"/>, the query's decoded parameters; null where it holds a ';', to
    /// be rebuilt.
    /// </summary>
    public static string? Edited(string query, IQueryCollection original, IDictionary<string, StringValues> edited)
    {
        if (query.Contains(';', StringComparison.Ordinal))
        {
            return null; // even where nothing changed as ASP.NET Core reads it: ?keep=1;drop=1 holds no drop for it
        }

        if (edited.Count == original.Count && original.All(pair => edited.TryGetValue(pair.Key, out var values) && Same(values, pair.Value)))
        {
            return query;
        }

        var parts = new List<string>();
        var placed = new HashSet<string>(StringComparer.OrdinalIgnoreCase);
        foreach (var part in query.Length > 1 ? query[1..].Split('&') : [])
        {
            var equals = part.IndexOf('=', StringComparison.Ordinal);
            var name = Decode(equals < 0 ? part : part[..equals]);
            if (!original.TryGetValue(name, out var before) || edited.TryGetValue(name, out var after) && StartsWith(after, before))
            {
                parts.Add(part); // no parameter of the parser's (an empty part), or unchanged, or appended to
            }
            else if (edited.TryGetValue(name, out var changed) && placed.Add(name))
            {
                Append(parts, name, changed); // changed: its values where it first stood
            }
        }

        foreach (var (name, values) in edited)
        {
            var before = original.TryGetValue(name, out var had) ? had : StringValues.Empty;
            if (values.Count > before.Count && StartsWith(values, before))
            {
                Append(parts, name, values.Skip(before.Count)); // appended, or a new name
            }
        }

        return parts.Count == 0 ? "" : "?" + string.Join('&', parts);
    }

    /// <summary>A name as ASP.NET Core's query parser reads it: '+' is a space, then escapes decoded.</summary>
    private static string Decode(string name) => Uri.UnescapeDataString(name.Replace('+', ' '));

    private static bool Same(StringValues a, StringValues b) => a.Count == b.Count && StartsWith(a, b);

    private static bool StartsWith(StringValues values, StringValues start) =>
        values.Count >= start.Count && values.Take(start.Count).SequenceEqual(start, StringComparer.Ordinal);

    /// <summary>Each value as name=value, escaped as YARP's query builder escapes them.</summary>
    private static void Append(List<string> parts, string name, IEnumerable<string?> values)
    {
        var encodedName = UrlEncoder.Default.Encode(name);
        parts.AddRange(values.Select(value => string.Concat(encodedName, "=", UrlEncoder.Default.Encode(value ?? ""))));
    }
}
