using System.Globalization;
using System.Text;
using System.Text.RegularExpressions;
using Microsoft.AspNetCore.Http;
using Microsoft.AspNetCore.Routing;
using Microsoft.AspNetCore.Routing.Constraints;
using Microsoft.AspNetCore.Routing.Patterns;
using Microsoft.Extensions.Configuration;
using Microsoft.Extensions.DependencyInjection;
using Yarp.ReverseProxy.Configuration;

namespace Tern.Proxy.Configuration;

/// <summary>
/// Checks the parts of the standard YARP "ReverseProxy" section whose mistakes YARP would only
/// show per request (a route to a missing cluster, a destination that is not a URL), or show
/// without the key (a value its reader cannot convert), with the key. YARP's own validation still
/// runs after this one.
/// </summary>
internal static partial class ReverseProxyValidator
{
    public const string Section = "ReverseProxy";

    /// <summary>Route metadata key that lets a route answer on the plain-HTTP listener instead of redirecting.</summary>
    public const string AllowPlainHttpMetadata = "Tern.AllowPlainHttp";

    /// <summary>Cluster metadata key for the idle timeout of that cluster's pooled connections (instead of Tern:Forwarding:PooledConnectionIdleTimeout).</summary>
    public const string PooledConnectionIdleTimeoutMetadata = "Tern.PooledConnectionIdleTimeout";

    /// <summary>Cluster metadata key for the time to open a connection to that cluster's destinations (instead of Tern:Forwarding:ConnectTimeout).</summary>
    public const string ConnectTimeoutMetadata = "Tern.ConnectTimeout";

    /// <summary>The cluster metadata keys whose values are durations.</summary>
    public static readonly string[] DurationMetadata = [PooledConnectionIdleTimeoutMetadata, ConnectTimeoutMetadata];

    /// <summary>
    /// The cluster metadata YARP's health policies read, as numbers (invariant culture), with what
    /// each must be. YARP takes its default without a word where a value does not parse ("50%"),
    /// and takes any number: a RateLimit of 0 or below marked every destination down at its first
    /// requests, failed or not, one above 1 never.
    /// </summary>
    public static readonly (string Name, Func<double, bool> Valid, string Expected)[] HealthPolicyMetadata =
    [
        ("ConsecutiveFailuresHealthPolicy.Threshold", v => v >= 1, "a number of failed probes in a row, 1 or more (YARP's default is 2)"),
        ("TransportFailureRateHealthPolicy.RateLimit", v => v is > 0 and <= 1, "a failure rate above 0 and at most 1 (YARP's default, 0.3, is 30%)"),
    ];

    /// <param name="configuration">The whole configuration.</param>
    /// <param name="values">The section's values (ReverseProxy:... keys), listed once by the caller: listing a large section costs.</param>
    /// <param name="problems">Where each problem goes.</param>
    public static void Validate(IConfiguration configuration, IReadOnlyList<KeyValuePair<string, string?>> values, List<ConfigurationProblem> problems)
    {
        CheckValuesYarpReads(values, problems);

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

            // YARP hands it to Kestrel on each request, which throws on a value below -1: a 500 each time.
            var bodySize = route["MaxRequestBodySize"];
            if (!string.IsNullOrEmpty(bodySize) && long.TryParse(bodySize, System.Globalization.NumberStyles.Integer, System.Globalization.CultureInfo.InvariantCulture, out var size) && size < -1)
            {
                problems.Add(new($"{route.Path}:MaxRequestBodySize", $"'{bodySize}' is out of range: a number of bytes, or -1 for no limit"));
            }

            // YARP 2.1 does not read it (and Tern runs no output cache): the operator would believe
            // responses are cached.
            if (!string.IsNullOrEmpty(route["OutputCachePolicy"]))
            {
                problems.Add(new($"{route.Path}:OutputCachePolicy", "is not supported by Tern, which caches no responses; remove it"));
            }

            CheckPolicies(route, problems);
            CheckHosts(route, problems);

            // A header no request can carry: the route matched nothing (or, by its absence, everything), without a word.
            foreach (var header in route.GetSection("Match:Headers").GetChildren())
            {
                if (header["Name"] is { Length: > 0 } name && !HttpSyntax.IsToken(name))
                {
                    // Matched by its absence (NotExists, NotContains; by name or number, as YARP reads it), it is absent from every request.
                    var absent = Enum.TryParse<HeaderMatchMode>(header["Mode"], ignoreCase: true, out var mode) && mode is HeaderMatchMode.NotExists or HeaderMatchMode.NotContains;
                    problems.Add(new($"{header.Path}:Name", $"'{name}' is not a header name ({HttpSyntax.TokenChars}): no request carries it, so the route would match {(absent ? "every request its other matches take" : "none")}"));
                }
            }

            CheckQueryMatches(route, problems);

            var path = route["Match:Path"];
            var pattern = string.IsNullOrEmpty(path) ? null : Parse(path);
            if (pattern is not null)
            {
                CheckPathTemplate(route, path!, pattern, problems);
                CheckConstraints(route, path!, pattern, problems);

                // The router matches the path as Kestrel decodes it: a literal written with escapes matched no request.
                if (pattern.PathSegments.SelectMany(s => s.Parts).OfType<RoutePatternLiteralPart>().Any(l => HttpSyntax.DecodedAsPath(l.Content) != l.Content))
                {
                    problems.Add(new($"{route.Path}:Match:Path", $"'{path}' is matched against the request's path as Kestrel decodes it (every escape but %2F), so the route would match no request; {HttpSyntax.WriteDecoded(HttpSyntax.DecodedAsPath(path!))}"));
                }
            }

            // PathPatterns only against a Match:Path YARP can read: it names one it cannot itself.
            TransformChecks.Check(route, string.IsNullOrEmpty(path) ? Parse(EveryPath) : pattern, pathReadable: string.IsNullOrEmpty(path) || pattern is not null, problems);

            var allowPlain = route[$"Metadata:{AllowPlainHttpMetadata}"];
            if (allowPlain is not null && !bool.TryParse(allowPlain, out _))
            {
                problems.Add(new($"{route.Path}:Metadata:{AllowPlainHttpMetadata}", $"'{allowPlain}' is not true or false"));
            }
        }

        DuplicateRoutes.Check(configuration.GetSection($"{Section}:Routes").GetChildren(), problems);

        foreach (var cluster in clusters)
        {
            var destinations = cluster.GetSection("Destinations").GetChildren().ToList();
            if (destinations.Count == 0)
            {
                problems.Add(new($"{cluster.Path}:Destinations", "the cluster has no destinations; add one with an Address"));
            }

            foreach (var destination in destinations)
            {
                if (AddressProblem(destination["Address"]) is { } problem)
                {
                    problems.Add(new($"{destination.Path}:Address", problem));
                }

                if (!string.IsNullOrEmpty(destination["Health"]) && AddressProblem(destination["Health"], probe: true) is { } health)
                {
                    problems.Add(new($"{destination.Path}:Health", health));
                }

                if (destination["Host"] is { Length: > 0 } host && !IsHostHeader(host))
                {
                    problems.Add(new($"{destination.Path}:Host", $"'{host}' is not a Host header in ASCII (a name or an address, with a port or none; an international name in punycode, xn--...): .NET's client would refuse it, failing every request to the destination, or send it as other bytes (Latin-1)"));
                }
            }

            // YARP builds each probe's PathString from it, which throws on every probe (logged
            // as a failure to construct the probe) when it does not start with '/'.
            // YARP 2.1 takes it as a path alone, escaping a query or fragment into it:
            // /healthz?ready=1 probed /healthz%3Fready=1, which most upstreams answer 404, marking
            // each destination unhealthy (YARP then sends to all alike: HealthyOrPanic).
            var probePath = cluster["HealthCheck:Active:Path"];
            if (!string.IsNullOrEmpty(probePath) && probePath[0] != '/')
            {
                problems.Add(new($"{cluster.Path}:HealthCheck:Active:Path", $"'{probePath}' does not start with /"));
            }
            else if (probePath?.IndexOfAny(['?', '#']) is >= 0 and var at)
            {
                problems.Add(new($"{cluster.Path}:HealthCheck:Active:Path", $"'{probePath}' has a {(probePath[at] == '?' ? "query" : "fragment")}, which YARP 2.1 would send escaped as part of the path ({probePath[..at]}%{(int)probePath[at]:X2}{probePath[(at + 1)..]}): most upstreams answer such a probe 404, marking every destination unhealthy, the dead with the live, and a catch-all one 200 whatever its state; YARP 2.1 probes a path alone"));
            }

            foreach (var key in DurationMetadata)
            {
                if (cluster[$"Metadata:{key}"] is { } duration && SettingReader.ParseDuration(duration).Problem is { } problem)
                {
                    problems.Add(new($"{cluster.Path}:Metadata:{key}", problem));
                }
            }

            foreach (var (name, valid, expected) in HealthPolicyMetadata)
            {
                if (cluster[$"Metadata:{name}"] is { } text
                    && !(double.TryParse(text, NumberStyles.Float, CultureInfo.InvariantCulture, out var number) && double.IsFinite(number) && valid(number)))
                {
                    problems.Add(new($"{cluster.Path}:Metadata:{name}", $"'{text}' is not {expected}"));
                }
            }

            // Tern passes header bytes unchanged (Forwarding.HeaderBytes); a decoding of its own
            // would turn them into other bytes (UTF-8 read as UTF-8, then written as Latin-1).
            foreach (var key in (string[])["HttpClient:RequestHeaderEncoding", "HttpClient:ResponseHeaderEncoding"])
            {
                if (cluster[key] is not null)
                {
                    problems.Add(new($"{cluster.Path}:{key}", "is not supported by Tern, which passes header bytes to and from upstreams unchanged; remove it"));
                }
            }

            // YARP takes it in whole milliseconds for each request's CancelAfter: at 0 (anything
            // under 1 ms) it answered every request 504 at once, and below -1 every request was a
            // 500 with a stack trace. -1 ms is .NET's "none", as YARP takes it.
            var activity = cluster["HttpRequest:ActivityTimeout"];
            if (TimeSpan.TryParseExact(activity, "c", CultureInfo.InvariantCulture, out var idle) && (int)idle.TotalMilliseconds is var ms and (0 or < -1))
            {
                problems.Add(new($"{cluster.Path}:HttpRequest:ActivityTimeout", ms == 0
                    ? $"'{activity}' comes to 0 ms, as YARP counts it (whole milliseconds): it would answer every request of the cluster 504 at once; for long-lived requests give a long one, such as 1.00:00:00"
                    : $"'{activity}' is negative: YARP would fail every request of the cluster (500); for long-lived requests give a long one, such as 1.00:00:00"));
            }

            CheckHttp3(cluster, destinations, problems);
            CheckAffinity(cluster.GetSection("SessionAffinity"), problems);

            // YARP's HashCookie policy needs System.IO.Hashing, which this build cannot ship (see
            // Directory.Packages.props); it is YARP's default where no policy is named, and then
            // every request of the cluster failed on the missing assembly.
            var policy = cluster["SessionAffinity:Policy"];
            if (string.Equals(policy, "HashCookie", StringComparison.OrdinalIgnoreCase))
            {
                problems.Add(new($"{cluster.Path}:SessionAffinity:Policy", "HashCookie is not supported by Tern; use Cookie or ArrCookie"));
            }
            else if (string.IsNullOrEmpty(policy) && bool.TryParse(cluster["SessionAffinity:Enabled"], out var affinity) && affinity)
            {
                problems.Add(new($"{cluster.Path}:SessionAffinity:Policy", "is required: YARP's default, HashCookie, is not supported by Tern; set Cookie or ArrCookie"));
            }
        }
    }

    /// <summary>
    /// HTTP/3 required of the upstream (HttpRequest:Version 3, VersionPolicy RequestVersionExact or
    /// RequestVersionOrHigher): .NET's client speaks it over TLS only, and only where QUIC can be
    /// had (libmsquic installed); where it could not, every request of the cluster failed (502),
    /// blamed on the upstream.
    /// </summary>
    private static void CheckHttp3(IConfigurationSection cluster, List<IConfigurationSection> destinations, List<ConfigurationProblem> problems)
    {
        var version = cluster["HttpRequest:Version"];
        // YARP reads "3" as 3.0.
        if (!Version.TryParse(version?.Contains('.', StringComparison.Ordinal) == false ? version + ".0" : version, out var asks) || asks != new Version(3, 0)
            || !Enum.TryParse<HttpVersionPolicy>(cluster["HttpRequest:VersionPolicy"], ignoreCase: true, out var policy) || policy == HttpVersionPolicy.RequestVersionOrLower)
        {
            return;
        }

        var asked = $"'{version}' with VersionPolicy {policy} asks for HTTP/3";
        if (destinations.FirstOrDefault(d => d["Address"]?.StartsWith("http://", StringComparison.OrdinalIgnoreCase) == true) is { } plain)
        {
            problems.Add(new($"{cluster.Path}:HttpRequest:Version", $"{asked}, which runs over TLS only, and destination '{plain.Key}' is http://: every request to it would fail (502); give https:// destinations (VersionPolicy RequestVersionOrLower would send this one HTTP/1.1)"));
        }
        else if (!((OperatingSystem.IsLinux() || OperatingSystem.IsWindows() || OperatingSystem.IsMacOS()) && System.Net.Quic.QuicConnection.IsSupported))
        {
            problems.Add(new($"{cluster.Path}:HttpRequest:Version", $"{asked}, which .NET cannot speak on this machine (its QUIC is not supported here: it needs libmsquic); every request of the cluster would fail (502); give VersionPolicy RequestVersionOrLower to take HTTP/3 where it can be had"));
        }
    }

    /// <summary>
    /// The session-affinity cookie or header YARP sets on each response. A name that is not a
    /// token made every request of the cluster fail (502), after its upstream had answered. A
    /// cookie's Path and Domain went into Set-Cookie unchecked (';' started another attribute).
    /// Browsers refuse a cookie marked SameSite=None, or named __Secure- or __Host-, without
    /// Secure, which SecurePolicy None leaves out (Tern's default is SameAsRequest: see
    /// AffinityCookieDefaults), and a __Host- one with a Domain or a Path other than /: affinity
    /// would never hold.
    /// </summary>
    private static void CheckAffinity(IConfigurationSection affinity, List<ConfigurationProblem> problems)
    {
        if (!bool.TryParse(affinity["Enabled"], out var enabled) || !enabled)
        {
            return;
        }

        var header = string.Equals(affinity["Policy"], "CustomHeader", StringComparison.OrdinalIgnoreCase);
        var name = affinity["AffinityKeyName"];
        if (!string.IsNullOrEmpty(name) && !HttpSyntax.IsToken(name))
        {
            var what = header ? "header" : "cookie";
            problems.Add(new($"{affinity.Path}:AffinityKeyName", $"'{name}' is not a {what} name ({HttpSyntax.TokenChars}): the affinity {what} could not be set, and every request of the cluster would fail after its upstream had answered"));
        }

        if (header)
        {
            return; // the Cookie settings are the cookie policies'
        }

        var cookie = affinity.GetSection("Cookie");
        var path = cookie["Path"];
        if (path is not null && (!path.StartsWith('/') || path.Any(c => c is ';' or <= ' ' or >= '\x7f')))
        {
            problems.Add(new($"{cookie.Path}:Path", $"'{path}' is not a cookie path: one starting with /, of visible ASCII other than ';' (percent-encode the rest, as browsers send paths); leave it out for /"));
        }

        var domain = cookie["Domain"];
        // Browsers take one leading dot, and a name in ASCII only (an international one in punycode).
        if (!string.IsNullOrEmpty(domain) && (!Ascii.IsValid(domain) || Uri.CheckHostName(domain.StartsWith('.') ? domain[1..] : domain) is not (UriHostNameType.Dns or UriHostNameType.IPv4)))
        {
            problems.Add(new($"{cookie.Path}:Domain", $"'{domain}' is not a host name in ASCII (example.com, which takes in its subdomains; an international name in punycode, xn--...): browsers would refuse the cookie"));
        }

        // YARP reads a number as the enum's value, defined or not: one it does not define is no
        // policy ASP.NET Core knows (SecurePolicy 5 never marked the cookie Secure).
        Undefined<CookieSecurePolicy>(cookie, "SecurePolicy", problems);
        Undefined<SameSiteMode>(cookie, "SameSite", problems);

        var secure = !Enum.TryParse<CookieSecurePolicy>(cookie["SecurePolicy"], ignoreCase: true, out var policy) || policy != CookieSecurePolicy.None;
        const string LeaveSecure = "leave SecurePolicy out (Secure over HTTPS) or set it to Always";
        if (!secure && Enum.TryParse<SameSiteMode>(cookie["SameSite"], ignoreCase: true, out var sameSite) && sameSite == SameSiteMode.None)
        {
            problems.Add(new($"{cookie.Path}:SameSite", $"None needs the cookie marked Secure, which SecurePolicy None leaves out: browsers would refuse the cookie, and affinity would never hold; {LeaveSecure}"));
        }

        if (name is null)
        {
            return;
        }

        if (!secure && (name.StartsWith("__Secure-", StringComparison.OrdinalIgnoreCase) || name.StartsWith("__Host-", StringComparison.OrdinalIgnoreCase)))
        {
            problems.Add(new($"{affinity.Path}:AffinityKeyName", $"'{name}' needs the cookie marked Secure, which SecurePolicy None leaves out: browsers would refuse the cookie, and affinity would never hold; {LeaveSecure}"));
        }

        if (name.StartsWith("__Host-", StringComparison.OrdinalIgnoreCase) && (!string.IsNullOrEmpty(domain) || (path is not null && path != "/")))
        {
            problems.Add(new($"{affinity.Path}:AffinityKeyName", $"'{name}' needs the cookie without a Domain and with the Path /: browsers would refuse the cookie, and affinity would never hold; leave Cookie:Domain and Cookie:Path out"));
        }
    }

    /// <summary>A number given for an enum that is none of its values.</summary>
    private static void Undefined<T>(IConfigurationSection section, string key, List<ConfigurationProblem> problems)
        where T : struct, Enum
    {
        if (section[key] is { Length: > 0 } given && long.TryParse(given, NumberStyles.Integer, CultureInfo.InvariantCulture, out _)
            && Enum.TryParse<T>(given, out var value) && !Enum.IsDefined(value))
        {
            problems.Add(new($"{section.Path}:{key}", $"'{given}' is not one of {string.Join(", ", Enum.GetNames<T>())}"));
        }
    }

    /// <summary>Whether .NET's client takes the text as a Host header, as it does at each request, in ASCII (anything else it sent as Latin-1 bytes).</summary>
    private static bool IsHostHeader(string host)
    {
        if (!Ascii.IsValid(host))
        {
            return false;
        }

        using var request = new HttpRequestMessage();
        try
        {
            request.Headers.Host = host;
            return true;
        }
        catch (FormatException)
        {
            return false;
        }
    }

    /// <summary>
    /// Why an upstream address (or, for <paramref name="probe"/>, a destination's Health address)
    /// cannot be used, or null. YARP joins the request's path and query to an address as text, so
    /// a query in it went before every request's path (?x=1/api?q=1) and a fragment into it
    /// (/base#f/api); a probe drops both. The URL's user and password are never sent.
    /// </summary>
    private static string? AddressProblem(string? address, bool probe = false)
    {
        if (!Uri.TryCreate(address, UriKind.Absolute, out var uri) || (uri.Scheme != Uri.UriSchemeHttp && uri.Scheme != Uri.UriSchemeHttps) || string.IsNullOrEmpty(uri.Host))
        {
            return $"'{address}' is not an absolute http:// or https:// URL";
        }

        const string Form = "an address is scheme://host[:port][/path]";
        return uri switch
        {
            { UserInfo.Length: > 0 } => $"'{uri.GetComponents(UriComponents.SchemeAndServer | UriComponents.Path, UriFormat.UriEscaped)}' has a user and password (user@), which are never sent; send an Authorization header with a RequestHeader transform",
            { Query.Length: > 0 } when probe => $"'{address}' has a query ({uri.Query}), which YARP drops from its probes; {Form}, and the probe's path is HealthCheck:Active:Path",
            { Fragment.Length: > 0 } when probe => $"'{address}' has a fragment ({uri.Fragment}), which YARP drops from its probes; {Form}",
            { Query.Length: > 0 } => $"'{address}' has a query ({uri.Query}), which would be put before each request's path; {Form}",
            { Fragment.Length: > 0 } => $"'{address}' has a fragment ({uri.Fragment}), which would be sent inside each request's path; {Form}",
            _ => null,
        };
    }

    /// <summary>
    /// The route's policies of ASP.NET Core's middleware that Tern does not run (authentication,
    /// CORS, rate limiting) or defines no policies for (request timeouts: it reads the route's
    /// Timeout). YARP refuses a name it cannot find, as "not found"; its special names pass, and
    /// then AuthorizationPolicy Default and CorsPolicy Default or Disable failed every request of the
    /// route (500, with a stack trace logged: "contains authorization metadata, but a middleware
    /// was not found"), and RateLimiterPolicy Default limited nothing. The names that ask for
    /// nothing (Anonymous, Disable) are accepted.
    /// </summary>
    private static void CheckPolicies(IConfigurationSection route, List<ConfigurationProblem> problems)
    {
        Check("AuthorizationPolicy", "Anonymous", "Tern authenticates no one and has no authorization policies (the upstream checks the credentials Tern passes on); remove it");
        Check("CorsPolicy", null, "Tern answers no CORS itself (the upstream's CORS headers and its answers to preflight requests pass through); remove it");
        Check("RateLimiterPolicy", "Disable", "Tern limits no request rates and has no rate limiter policies; remove it");
        Check("TimeoutPolicy", "Disable", "Tern has no timeout policies; remove it and give the route a Timeout (00:00:30, say)");

        void Check(string key, string? harmless, string reason)
        {
            if (route[key] is { Length: > 0 } value && !string.Equals(value, harmless, StringComparison.OrdinalIgnoreCase))
            {
                problems.Add(new($"{route.Path}:{key}", $"'{value}': {reason}"));
            }
        }
    }

    /// <summary>
    /// Match:Hosts as ASP.NET Core's host matching reads them (host, or host:port where port is a
    /// number or *, split at every ':'): a host it cannot read (an IPv6 address, an empty port)
    /// made every request of every route a 500, with its exception logged, and a port no request
    /// can carry (0, 70000) left the route unreachable. '[' is taken as the start of an IPv6
    /// address, which ASP.NET Core would read as a name ([v]) that no request carries.
    /// </summary>
    private static void CheckHosts(IConfigurationSection route, List<ConfigurationProblem> problems)
    {
        foreach (var entry in route.GetSection("Match:Hosts").GetChildren())
        {
            var host = entry.Value;
            if (string.IsNullOrEmpty(host))
            {
                continue; // YARP names an empty host itself
            }

            var parts = host.Split(':');
            var problem = parts switch
            {
                _ when host.Contains("://", StringComparison.Ordinal) => $"a URL, not a host: write the host alone ({host[(host.IndexOf("://", StringComparison.Ordinal) + 3)..].Split('/')[0]}), and a path in Match:Path",
                _ when host.Contains('/', StringComparison.Ordinal) => "holds a '/', which no Host header does, so the route would match no request: write the host alone, and a path in Match:Path",
                _ when host.Contains('[', StringComparison.Ordinal) || parts.Length > 2 => "ASP.NET Core's host matching cannot match an IPv6 address, nor a host in brackets or with more than one ':'; leave Hosts out for a route served by address",
                [""] or ["", _] => "names no host: give a name (example.com, *.example.com) or *",
                [_, "*"] => null,
                [_, var port] when !int.TryParse(port, NumberStyles.Integer, CultureInfo.InvariantCulture, out var number) || number is < 1 or > 65535 => $"'{port}' is not a port: give 1-65535 or *, or no port",
                _ => null,
            };
            if (problem is not null)
            {
                problems.Add(new(entry.Path, $"'{host}': {problem}"));
            }
        }
    }

    /// <summary>
    /// Match:QueryParameters are compared with the request's decoded query (ASP.NET Core's
    /// Request.Query): a name or value written with escapes (a%20b) was carried by no request, so
    /// the route matched none, or with NotContains every request its other matches take.
    /// </summary>
    private static void CheckQueryMatches(IConfigurationSection route, List<ConfigurationProblem> problems)
    {
        foreach (var match in route.GetSection("Match:QueryParameters").GetChildren())
        {
            var notContains = Enum.TryParse<QueryParameterMatchMode>(match["Mode"], ignoreCase: true, out var mode) && mode == QueryParameterMatchMode.NotContains;
            if (match["Name"] is { Length: > 0 } name && HttpSyntax.DecodedAsQuery(name) is { } plainName)
            {
                problems.Add(new($"{match.Path}:Name", $"'{name}' is compared with the request's decoded query names, so no request carries it, and the route would match {(notContains ? "every request its other matches take" : "none")}; write '{plainName}'"));
            }

            foreach (var value in match.GetSection("Values").GetChildren())
            {
                if (value.Value is { Length: > 0 } text && HttpSyntax.DecodedAsQuery(text) is { } plainValue)
                {
                    problems.Add(new(value.Path, $"'{text}' is compared with the request's decoded query values, so it would never match{(notContains ? " (NotContains: every request that has the parameter would)" : "")}; write '{plainValue}'"));
                }
            }
        }
    }

    /// <summary>
    /// A Match:Path written as nginx or Envoy take a prefix, or as a regular expression (/api/*,
    /// /api/.*, /api/[^/]+, ^/api$): ASP.NET Core's route templates have no wildcards outside a
    /// {**catch-all}, so it matched that text alone and every other request of the route was a
    /// 404. A '$' alone is a literal (OData's /$metadata).
    /// </summary>
    private static void CheckPathTemplate(IConfigurationSection route, string path, RoutePattern pattern, List<ConfigurationProblem> problems)
    {
        var literals = string.Concat(pattern.PathSegments.SelectMany(s => s.Parts).OfType<RoutePatternLiteralPart>().Select(l => l.Content + "/"));
        var regex = path.StartsWith('^') || ((string[])[".*", ".+", "[^", "\\d", "\\w"]).Any(r => literals.Contains(r, StringComparison.Ordinal));
        if (!regex && !literals.Contains('*', StringComparison.Ordinal))
        {
            return;
        }

        var cut = path.IndexOfAny(['*', '{', '[', '\\', '+']);
        var prefix = (cut < 0 ? path : path[..cut]).TrimStart('^').TrimEnd('/', '.', '$');
        var exact = regex && cut < 0 && path.EndsWith('$'); // ^/api$: the one path
        var instead = exact ? $"for the path {prefix} alone write {prefix}" : $"for every path under {(prefix.Length == 0 ? "/" : prefix)} write {prefix.TrimEnd('/')}/{{**rest}}";
        problems.Add(new($"{route.Path}:Match:Path", $"'{path}' is written as {(regex ? "a regular expression" : "a wildcard")}, but a route template takes neither: it matches only the path '{path}' itself; {instead}"));
    }

    /// <summary>ASP.NET Core's constraint resolver and the names it knows, as Tern's host has them (AddRouting: with regex).</summary>
    private static readonly Lazy<(ParameterPolicyFactory Factory, IDictionary<string, Type> Names)> s_policies = new(() =>
    {
        var services = new ServiceCollection().AddRouting().BuildServiceProvider();
        return (services.GetRequiredService<ParameterPolicyFactory>(), services.GetRequiredService<Microsoft.Extensions.Options.IOptions<RouteOptions>>().Value.ConstraintMap);
    });

    /// <summary>
    /// The constraints of Match:Path's parameters, resolved as ASP.NET Core's router resolves them
    /// when it first builds its table: an unknown one ({id:foo}), arguments it cannot take
    /// ({id:length(x)}) or a regular expression that does not parse made that fail at every
    /// request, so every request of every route was a 500 with a stack trace, and a reload that
    /// brought one took the whole proxy down.
    /// </summary>
    private static void CheckConstraints(IConfigurationSection route, string path, RoutePattern pattern, List<ConfigurationProblem> problems)
    {
        const string Consequence = "ASP.NET Core's router would answer every request of every route 500";
        var (factory, names) = s_policies.Value;
        foreach (var parameter in pattern.Parameters)
        {
            foreach (var reference in parameter.ParameterPolicies.Where(p => p.Content is not null))
            {
                var name = reference.Content!.Split('(')[0];
                if (!names.ContainsKey(name))
                {
                    problems.Add(new($"{route.Path}:Match:Path", $"'{path}': '{name}' in {{{parameter.Name}:{reference.Content}}} is not one of ASP.NET Core's route constraints ({string.Join(", ", names.Keys.Order(StringComparer.Ordinal))}); {Consequence}"));
                    continue;
                }

                try
                {
                    var policy = factory.Create(parameter, reference.Content!);
                    if ((policy is OptionalRouteConstraint optional ? optional.InnerConstraint : policy) is RegexRouteConstraint regex)
                    {
                        _ = regex.Constraint; // built when first asked for
                    }
                }
                catch (Exception ex) when (ex is not OutOfMemoryException)
                {
                    // A regex is built when the router first tries the route, the others with its table.
                    var consequence = name.Equals("regex", StringComparison.OrdinalIgnoreCase)
                        ? "ASP.NET Core's router would answer 500 to each request it tries the route for (to every request of every route where another has a literal segment in its place)"
                        : Consequence;
                    problems.Add(new($"{route.Path}:Match:Path", $"'{path}': {{{parameter.Name}:{reference.Content}}} cannot be used: {ex.GetBaseException().Message.Split('\n')[0].Trim()} {consequence}"));
                }
            }
        }
    }

    /// <summary>A route template as ASP.NET Core reads it, or null when it cannot.</summary>
    /// <summary>The Match:Path YARP gives a route without one (Hosts alone): its PathPatterns can use {catchall}.</summary>
    internal const string EveryPath = "/{**catchall}";

    internal static RoutePattern? Parse(string template)
    {
        try
        {
            return RoutePatternFactory.Parse(template);
        }
        catch (RoutePatternException)
        {
            return null;
        }
    }

    /// <summary>
    /// The values YARP's reader converts (numbers, booleans, enums, durations, URIs). It names
    /// no key when one fails ("Requested value 'Tls9' was not found."), and on a reload it logs the
    /// failure with a stack trace; so Tern runs the same reader first, and when it fails, runs it on
    /// each value alone to find the ones it fails on. Durations are TimeSpan text, where a bare
    /// number is a number of days: "ActivityTimeout": "30" would be 30 days, so a bare number is
    /// refused.
    /// </summary>
    private static void CheckValuesYarpReads(IReadOnlyList<KeyValuePair<string, string?>> values, List<ConfigurationProblem> problems)
    {
        var before = problems.Count;
        var reported = new HashSet<string>(StringComparer.OrdinalIgnoreCase);
        foreach (var (key, value) in values)
        {
            if (Duration().IsMatch(key) && SettingReader.BareNumberForTimeSpan(value) is { } problem)
            {
                problems.Add(new(key, problem));
                reported.Add(key);
            }
        }

        if (YarpReadError(values) is not { } whole)
        {
            return;
        }

        foreach (var pair in values.Where(v => !reported.Contains(v.Key)))
        {
            if (YarpReadError([pair]) is { } error)
            {
                problems.Add(new(pair.Key, $"'{pair.Value}' is not a valid value: {error}"));
            }
        }

        if (problems.Count == before)
        {
            problems.Add(new(Section, whole)); // only a combination fails: YARP's words, without a key
        }
    }

    /// <summary>What YARP's own reader throws for these values (ReverseProxy:... keys), or null.</summary>
    private static string? YarpReadError(IReadOnlyList<KeyValuePair<string, string?>> values)
    {
        var services = new ServiceCollection().AddLogging();
        var gate = new ConfigurationGate();
        gate.Publish(values);
        services.AddReverseProxy().LoadFromConfig(gate.Root.GetSection(Section));
        using var provider = services.BuildServiceProvider();
        try
        {
            provider.GetRequiredService<IProxyConfigProvider>().GetConfig();
            return null;
        }
        catch (Exception ex) when (ex is not OutOfMemoryException)
        {
            // Whatever YARP's reader throws, the same values would fail it when YARP loads them.
            return ex.Message.Split('\n')[0].Trim();
        }
    }

    /// <summary>The keys YARP reads as a TimeSpan.</summary>
    [GeneratedRegex(@"^ReverseProxy:(Routes:[^:]+:Timeout|Clusters:[^:]+:(HttpRequest:ActivityTimeout|HealthCheck:Active:(Interval|Timeout)|HealthCheck:Passive:ReactivationPeriod|SessionAffinity:Cookie:(Expiration|MaxAge)))$", RegexOptions.IgnoreCase)]
    private static partial Regex Duration();
}
