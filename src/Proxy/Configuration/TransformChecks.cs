using Microsoft.AspNetCore.Routing.Patterns;
using Microsoft.Extensions.Configuration;

namespace Tern.Proxy.Configuration;

/// <summary>
/// A route's transforms that YARP takes but then fails on, or carries out otherwise than written,
/// at every request of the route: it checks their kind and keys, not the headers they name.
/// </summary>
internal static class TransformChecks
{
    /// <summary>The transforms whose value is the name of a header they set, and whether Set and Append give its value.</summary>
    private static readonly (string Key, bool Valued)[] s_headerNamed =
    [
        ("RequestHeader", true), ("ResponseHeader", true), ("ResponseTrailer", true),
        ("RequestHeaderRouteValue", false), // Set and Append name a route value
        ("ClientCert", false),
    ];

    /// <summary>The headers that frame a message, which Tern sets from its body for each.</summary>
    private static readonly string[] s_framing = ["Content-Length", "Transfer-Encoding"];

    /// <param name="route">A route of the ReverseProxy section.</param>
    /// <param name="match">The route's Match:Path, parsed; null where it has none.</param>
    /// <param name="pathReadable">Whether YARP can read the route's Match:Path (none is read as every path): PathPatterns are checked against it only then.</param>
    /// <param name="problems">Where each problem goes.</param>
    public static void Check(IConfigurationSection route, RoutePattern? match, bool pathReadable, List<ConfigurationProblem> problems)
    {
        foreach (var transform in route.GetSection("Transforms").GetChildren())
        {
            // Configuration keys are case-insensitive, as YARP reads a transform's.
            var entries = transform.GetChildren().ToDictionary(e => e.Key, StringComparer.OrdinalIgnoreCase);
            if (pathReadable)
            {
                CheckPathPattern(route, entries, match, problems);
            }

            CheckCatchAll(entries, match, problems);
            CheckHeaders(entries, problems);
            CheckPathsAndQueries(entries, problems);
            CheckMethod(entries, problems);
        }
    }

    /// <summary>The transforms whose value YARP escapes into the path or query it sends.</summary>
    private static readonly string[] s_escapedByYarp = ["PathSet", "PathPrefix", "PathPattern", "QueryValueParameter", "QueryRouteParameter"];

    /// <summary>
    /// Paths and query names and values as YARP reads them: as text, which it escapes itself. One
    /// written with escapes reached the upstream escaped twice (/caf%C3%A9 as /caf%25C3%25A9), and
    /// a '?' or '#' in a path escaped inside it (/search?q=1 as /search%3Fq=1). A prefix to remove,
    /// and a query name to remove, are compared with the request's decoded path and query, so one
    /// written with escapes (but %2F in a path, which Kestrel keeps) was never removed; and a prefix
    /// that ends with '/' only from that path itself: YARP removes one where a segment ends.
    /// </summary>
    private static void CheckPathsAndQueries(Dictionary<string, IConfigurationSection> transform, List<ConfigurationProblem> problems)
    {
        foreach (var key in s_escapedByYarp)
        {
            if (transform.GetValueOrDefault(key) is not { Value: { Length: > 0 } text } entry)
            {
                continue;
            }

            // A PathPattern's literals alone: its parameters' values are escaped once, and a
            // default never reaches the upstream. YARP refuses one that does not parse, or holds a '?'.
            var scanned = text;
            if (key == "PathPattern")
            {
                if (ReverseProxyValidator.Parse(text) is not { } pattern)
                {
                    continue;
                }

                scanned = string.Concat(pattern.PathSegments.SelectMany(s => s.Parts).OfType<RoutePatternLiteralPart>().Select(l => l.Content));
            }

            if (key.StartsWith("Path", StringComparison.Ordinal) && scanned.IndexOfAny(['?', '#']) is >= 0 and var at)
            {
                problems.Add(new(entry.Path, $"'{text}' holds '{scanned[at]}', which YARP would send escaped inside the path (%{(int)scanned[at]:X2}), not as {(scanned[at] == '?' ? "the start of a query; set query values with QueryValueParameter" : "a fragment, which upstreams never get")}"));
            }
            else if (TwiceEscaped(text, scanned) is { } twice)
            {
                problems.Add(new(entry.Path, twice));
            }
        }

        // QueryValueParameter's Set or Append is the value; QueryRouteParameter's names a route value.
        if (transform.GetValueOrDefault("QueryValueParameter") is not null)
        {
            foreach (var given in (string[])["Set", "Append"])
            {
                if (transform.GetValueOrDefault(given) is { Value: { Length: > 0 } value } entry && TwiceEscaped(value, value) is { } problem)
                {
                    problems.Add(new(entry.Path, problem));
                }
            }
        }

        if (transform.GetValueOrDefault("PathRemovePrefix") is { Value: { Length: > 0 } prefix } remove)
        {
            if (prefix.EndsWith('/'))
            {
                problems.Add(new(remove.Path, prefix == "/"
                    ? "'/' is removed only from paths that begin '//': YARP removes a prefix where a segment ends; remove the transform"
                    : $"'{prefix}' ends with '/': YARP removes a prefix where a segment ends, so it would be removed only from the path '{prefix}' itself and paths that begin '{prefix}/', never from the paths under it ('{prefix}x'); write '{prefix.TrimEnd('/')}'"));
            }
            else if (HttpSyntax.DecodedAsPath(prefix) is var decoded && decoded != prefix)
            {
                problems.Add(new(remove.Path, $"'{prefix}' is compared with the request's path as Kestrel decodes it (every escape but %2F), so it would never be removed; {HttpSyntax.WriteDecoded(decoded)}"));
            }
        }

        if (transform.GetValueOrDefault("QueryRemoveParameter") is { Value: { Length: > 0 } name } removeName && HttpSyntax.DecodedAsQuery(name) is { } plain)
        {
            problems.Add(new(removeName.Path, $"'{name}' is compared with the request's decoded query names, so it would never be removed; write '{plain}'"));
        }
    }

    /// <summary>The problem of a value YARP escapes, written with escapes of its own (found in the part scanned), or null.</summary>
    private static string? TwiceEscaped(string text, string scanned)
    {
        if (HttpSyntax.FirstEscape(scanned) is not { } escape)
        {
            return null;
        }

        var plain = Uri.UnescapeDataString(text);
        var instead = HttpSyntax.FirstEscape(plain) is null && !scanned.Contains("%2F", StringComparison.OrdinalIgnoreCase)
            ? $"; write the characters themselves ('{plain}')"
            : "";
        return $"'{text}' is written with escapes, but YARP escapes the value itself: '{escape}' would reach the upstream as '%25{escape[1..]}'{instead}";
    }

    /// <summary>
    /// A method a route may not change a request to: .NET's client takes CONNECT for a tunnel (it
    /// sent CONNECT host:port, and the client got the answer's raw bytes, chunk sizes and all, until
    /// Tern's shutdown cut it), and Tern answers a client's TRACE 405 (an upstream that answers it
    /// echoes the request, cookies and credentials with it, to whoever sent it).
    /// </summary>
    private static void CheckMethod(Dictionary<string, IConfigurationSection> transform, List<ConfigurationProblem> problems)
    {
        if (transform.GetValueOrDefault("HttpMethodChange") is not null && transform.GetValueOrDefault("Set") is { Value: { } method } set
            && (method.Equals("CONNECT", StringComparison.OrdinalIgnoreCase) || method.Equals("TRACE", StringComparison.OrdinalIgnoreCase)))
        {
            problems.Add(new(set.Path, method.Equals("CONNECT", StringComparison.OrdinalIgnoreCase)
                ? $"'{method}' would make .NET's client ask the upstream for a tunnel (CONNECT host:port, the path left out) instead of sending the request, and pass the client the raw bytes of its answer, framing and all, until one side closed"
                : $"'{method}' asks the upstream to echo the request, its cookies and credentials with it, back to the client (cross-site tracing), which is why Tern answers a client's TRACE 405"));
        }
    }

    /// <summary>
    /// A PathPattern transform's parameters must be captured by the route's Match:Path, YARP's
    /// only source for them: a misnamed one ({**rest} against {**remainder}) was left out of the
    /// path sent upstream, and an unfilled required one made it '/', for every request of the
    /// route and without a word.
    /// </summary>
    private static void CheckPathPattern(IConfigurationSection route, Dictionary<string, IConfigurationSection> transform, RoutePattern? match, List<ConfigurationProblem> problems)
    {
        var entry = transform.GetValueOrDefault("PathPattern");
        if (string.IsNullOrEmpty(entry?.Value) || ReverseProxyValidator.Parse(entry.Value) is not { } used)
        {
            return; // one YARP cannot parse, YARP refuses itself
        }

        var captured = new HashSet<string>(match?.Parameters.Select(p => p.Name) ?? [], StringComparer.OrdinalIgnoreCase);
        foreach (var name in used.Parameters.Select(p => p.Name).Where(n => !captured.Contains(n)))
        {
            problems.Add(new(entry.Path, $"'{entry.Value}' uses {{{name}}}, which {route.Path}:Match:Path does not capture ({(captured.Count == 0 ? "it captures nothing" : "it captures " + string.Join(", ", captured.Order(StringComparer.OrdinalIgnoreCase).Select(c => "{" + c + "}")))}); YARP would leave it out of the path it sends, or send / where it is required"));
        }

    }

    /// <summary>
    /// A PathPattern parameter other than a two-star catch-all ({*rest}, or {rest}) for a value the
    /// route's Match:Path catches whole ({**rest} or {*rest}): filled with its '/' escaped, which
    /// YARP escapes again (/a/b reached the upstream as /a%252Fb). A value of one segment ({rest})
    /// holds no '/', and goes alike in any form (as the client wrote it: RawPattern).
    /// </summary>
    private static void CheckCatchAll(Dictionary<string, IConfigurationSection> transform, RoutePattern? match, List<ConfigurationProblem> problems)
    {
        var entry = transform.GetValueOrDefault("PathPattern");
        if (string.IsNullOrEmpty(entry?.Value) || ReverseProxyValidator.Parse(entry.Value) is not { } used)
        {
            return;
        }

        foreach (var parameter in used.Parameters.Where(p => !(p.IsCatchAll && !p.EncodeSlashes) && match?.GetParameter(p.Name) is { IsCatchAll: true }))
        {
            problems.Add(new(entry.Path, parameter.IsCatchAll
                ? $"'{entry.Value}' has {{*{parameter.Name}}}, a catch-all YARP fills with each '/' escaped and then escapes again: /a/b would reach the upstream as /a%252Fb; write {{**{parameter.Name}}}"
                : $"'{entry.Value}' has {{{parameter.Name}}}, one segment, for a value the route's Match:Path catches whole: YARP would fill it with each '/' escaped and then escape that again, so /a/b would reach the upstream as /a%252Fb; write {{**{parameter.Name}}}"));
        }
    }

    /// <summary>
    /// Header names and values a transform sets. .NET's client refuses a request header name that
    /// is not a token (502 for every request of the route) and drops a value with a line break
    /// (the header never sent); Kestrel refuses a response header's (502, after the upstream had
    /// answered; for a trailer a 500 logged with its stack). A value outside ASCII is sent one byte
    /// a character (HttpSyntax.FirstNonAscii). A transform setting Content-Length made every
    /// request of the route fail (502), and so did Transfer-Encoding on requests; on responses it
    /// mislabelled the body over HTTP/1.1 (gzip), and over HTTP/2 Kestrel removed it with a
    /// warning at every response. Tern frames each message from its body.
    /// </summary>
    private static void CheckHeaders(Dictionary<string, IConfigurationSection> transform, List<ConfigurationProblem> problems)
    {
        foreach (var (key, valued) in s_headerNamed)
        {
            if (transform.GetValueOrDefault(key) is not { Value: { Length: > 0 } name } entry)
            {
                continue; // YARP names an empty one itself
            }

            if (!HttpSyntax.IsToken(name))
            {
                problems.Add(new(entry.Path, $"'{name}' is not a header name ({HttpSyntax.TokenChars}): every request of the route would fail"));
                continue;
            }

            if (!valued)
            {
                continue;
            }

            if (s_framing.Contains(name, StringComparer.OrdinalIgnoreCase))
            {
                problems.Add(new(entry.Path, $"'{name}' frames the message, and Tern frames each from its body: set by a transform, it failed every request of the route, or mislabelled the response's body; remove the transform"));
            }

            foreach (var value in (string[])["Set", "Append"])
            {
                if (transform.GetValueOrDefault(value) is not { Value: { } text } given)
                {
                    continue;
                }

                if (HttpSyntax.FirstControl(text) is { } control)
                {
                    problems.Add(new(given.Path, $"'{text}' holds a control character ({HttpSyntax.Name(control)}), which no header value may carry (RFC 9110): Kestrel fails a response that has one, and .NET's client drops a request header with a line break and sends the others, for the upstream to refuse"));
                }
                else if (HttpSyntax.FirstNonAscii(text) is { } other)
                {
                    problems.Add(new(given.Path, $"'{text}' holds {HttpSyntax.Name(other)}, outside ASCII: Tern sends each character of a header as one byte, so it would arrive as {(other <= '\xff' ? $"the byte 0x{(int)other:X2}, not as UTF-8" : "'?'")}; write the value in ASCII (percent-encoded, say)"));
                }
            }
        }

        // X-Forwarded's headers are named HeaderPrefix + For, Proto, Host and Prefix.
        if (transform.GetValueOrDefault("X-Forwarded") is not null && transform.GetValueOrDefault("HeaderPrefix") is { Value: { Length: > 0 } prefix } prefixEntry && !HttpSyntax.IsToken(prefix))
        {
            problems.Add(new(prefixEntry.Path, $"'{prefix}' makes no header name ({HttpSyntax.TokenChars}): every request of the route would fail"));
        }
    }
}
