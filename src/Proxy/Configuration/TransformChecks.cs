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

            CheckHeaders(entries, problems);
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
