using System.Buffers;
using System.Net;
using Microsoft.Extensions.Primitives;
using Microsoft.Net.Http.Headers;
using Tern.Proxy.Configuration;
using Yarp.ReverseProxy.Configuration;
using Yarp.ReverseProxy.Model;
using Yarp.ReverseProxy.Transforms;
using Yarp.ReverseProxy.Transforms.Builder;

namespace Tern.Proxy.Forwarding;

/// <summary>
/// Tern's default request transforms for every route that does not configure its own:
/// X-Forwarded-For/-Proto/-Host describing the real client (incoming values are kept and
/// appended to only when the connection comes from Tern:Forwarding:TrustedProxies), and the
/// original Host header passed to the upstream unless the route sets RequestHeaderOriginalHost
/// or the destination its own Host;
/// Expect answered by Tern, not passed on; headers whose names have underscores not passed on;
/// the client's own path and query (ClientTarget); and the upstream's Server header kept from
/// the client, and its redirects to its own address made the client's.
/// </summary>
internal sealed class EdgeForwardedHeaders(ActiveConfiguration active) : ITransformProvider
{
    private const string ForwardedFor = "X-Forwarded-For";
    private const string ForwardedProto = "X-Forwarded-Proto";
    private const string ForwardedHost = "X-Forwarded-Host";
    private const string ForwardedPrefix = "X-Forwarded-Prefix";
    private const string Forwarded = "Forwarded";
    private const string Refresh = "Refresh";

    public void ValidateRoute(TransformRouteValidationContext context)
    {
    }

    public void ValidateCluster(TransformClusterValidationContext context)
    {
    }

    public void Apply(TransformBuilderContext context)
    {
        // First of all transforms, so that a route's own X-Forwarded transform (Append, say) never
        // passes on what an untrusted client claimed.
        context.RequestTransforms.Insert(0, new UntrustedForwardedHeaders(active));
        context.RequestTransforms.Insert(0, NoExpectation.Instance);
        context.RequestTransforms.Insert(0, new NoUnderscoreNames(active));
        var transforms = context.Route.Transforms ?? [];
        context.ResponseTransforms.Insert(0, new UpstreamResponseHeaders(active, ClientTarget.RedirectsOf(transforms, context.Route.Match.Path)));

        // A route with its own X-Forwarded or Forwarded transform has already turned the defaults off.
        if (context.UseDefaultForwarders ?? true)
        {
            context.UseDefaultForwarders = false;
            context.RequestTransforms.Add(new ClientForwardedHeaders(active));
        }

        if (!transforms.Any(t => t.ContainsKey("RequestHeaderOriginalHost")))
        {
            context.AddOriginalHost(true); // YARP's own, which keeps YARP from adding its default
            // A route that sets its own Host keeps it; one that sets it from a route value keeps
            // it where the value is there (YARP's transform sets nothing where it is not).
            if (!transforms.Any(t => SetsHost(t, "RequestHeader")))
            {
                context.RequestTransforms.Add(transforms.Any(t => SetsHost(t, "RequestHeaderRouteValue")) ? DestinationHost.UnlessSet : DestinationHost.Always);
            }
        }

        // Last, after any transform that could change the path or query.
        if (ClientTarget.For(transforms, context.Route.Match.Path) is { } target)
        {
            context.RequestTransforms.Add(target);
        }
    }

    /// <summary>Whether a route's transform of this kind (RequestHeader, RequestHeaderRouteValue) names the Host header.</summary>
    private static bool SetsHost(IReadOnlyDictionary<string, string> transform, string kind) =>
        transform.Any(e => e.Key.Equals(kind, StringComparison.OrdinalIgnoreCase) && e.Value.Equals(HeaderNames.Host, StringComparison.OrdinalIgnoreCase));

    /// <summary>A client's address as it is written: 127.0.0.1, not ::ffff:127.0.0.1 (the listeners are dual-stack).</summary>
    internal static IPAddress Plain(IPAddress address) => address.IsIPv4MappedToIPv6 ? address.MapToIPv4() : address;

    private static bool FromTrustedProxy(RequestTransformContext context, ActiveConfiguration active)
    {
        var client = context.HttpContext.Connection.RemoteIpAddress;
        var networks = active.Current.Settings.TrustedProxies;
        if (client is null || networks.Count == 0)
        {
            return false;
        }

        var address = Plain(client);
        foreach (var network in networks)
        {
            if (network.Contains(address))
            {
                return true;
            }
        }

        return false;
    }

    /// <summary>
    /// After YARP's RequestHeaderOriginalHost, which passes the client's Host on, on routes that
    /// set no Host of their own: a destination's own Host, which YARP sends only with
    /// RequestHeaderOriginalHost off, instead. Without it a destination's Host (an app on a shared
    /// host, an object store, a platform that routes by name) was dropped without a word, and the
    /// upstream got the client's. .NET's client takes it for the upstream's TLS name too (SNI, and
    /// the name its certificate is checked against), as for YARP's own.
    /// </summary>
    private sealed class DestinationHost(bool unlessSet) : RequestTransform
    {
        public static readonly DestinationHost Always = new(false);

        /// <summary>Where the route sets the Host from a route value: only where it did not (the Host is still the client's, as written).</summary>
        public static readonly DestinationHost UnlessSet = new(true);

        public override ValueTask ApplyAsync(RequestTransformContext context)
        {
            if (context.HttpContext.Features.Get<IReverseProxyFeature>()?.ProxiedDestination?.Model.Config.Host is not { Length: > 0 } destination)
            {
                return ValueTask.CompletedTask;
            }

            var headers = context.ProxyRequest.Headers;
            if (!unlessSet || !headers.NonValidated.TryGetValues(HeaderNames.Host, out var current)
                || string.Equals(current.ToString(), context.HttpContext.Request.Headers.Host.ToString(), StringComparison.Ordinal))
            {
                headers.Host = destination;
            }

            return ValueTask.CompletedTask;
        }
    }

    /// <summary>Drops every forwarding header a client not in TrustedProxies sent.</summary>
    private sealed class UntrustedForwardedHeaders(ActiveConfiguration active) : RequestTransform
    {
        public override ValueTask ApplyAsync(RequestTransformContext context)
        {
            if (!FromTrustedProxy(context, active))
            {
                TakeHeader(context, ForwardedFor);
                TakeHeader(context, ForwardedProto);
                TakeHeader(context, ForwardedHost);
                TakeHeader(context, ForwardedPrefix);
                TakeHeader(context, Forwarded);
            }

            return ValueTask.CompletedTask;
        }
    }

    /// <summary>
    /// Expect is answered here and not passed on, as nginx does. Kestrel sends the client its 100
    /// Continue when the body is first read, which is when the upstream request is sent; passed
    /// on, the expectation made .NET's client wait its Expect100ContinueTimeout (1 s) for an
    /// upstream's 100 before sending the body, a second on every upload from curl (which asks
    /// for 100 Continue on its own above 1 MB) or PHP's curl (above 1 KB). An unknown expectation
    /// is not Tern's to pass on either (RFC 9110, 10.1.1: a proxy may answer 417 or drop it).
    /// </summary>
    private sealed class NoExpectation : RequestTransform
    {
        public static readonly NoExpectation Instance = new();

        public override ValueTask ApplyAsync(RequestTransformContext context)
        {
            if (context.HttpContext.Request.Headers.Expect.Count != 0)
            {
                TakeHeader(context, "Expect");
            }

            return ValueTask.CompletedTask;
        }
    }

    /// <summary>
    /// Headers whose names have an underscore are not passed on, as nginx does by default
    /// (underscores_in_headers off), unless Tern:Forwarding:UnderscoresInHeaders. CGI, PHP, WSGI
    /// and Rack hand headers to applications as HTTP_X_FORWARDED_FOR and the like, a dash and an
    /// underscore alike: a client's X_Forwarded_For or X_Client_Cert arrives under the name of a
    /// header Tern sets, and some servers let it win (Puma's CVE-2024-45614). First of all
    /// transforms, so that a route's own transforms may still set such a header. Read from the
    /// copy YARP made, whose enumerator is a struct: Kestrel's request headers box theirs.
    /// </summary>
    private sealed class NoUnderscoreNames(ActiveConfiguration active) : RequestTransform
    {
        public override ValueTask ApplyAsync(RequestTransformContext context)
        {
            if (active.Current.Settings.UnderscoresInHeaders)
            {
                return ValueTask.CompletedTask;
            }

            List<string>? names = null;
            foreach (var (name, _) in context.ProxyRequest.Headers.NonValidated)
            {
                if (name.Contains('_', StringComparison.Ordinal))
                {
                    (names ??= []).Add(name);
                }
            }

            if (names is not null)
            {
                foreach (var name in names)
                {
                    context.ProxyRequest.Headers.Remove(name);
                }

                var request = context.HttpContext.Request;
                TernLog.UnderscoreHeadersDropped(ProxyErrorResponses.Logger(context.HttpContext), request.Method, request.Path, string.Join(", ", names));
            }

            return ValueTask.CompletedTask;
        }
    }

    /// <summary>
    /// The upstream's response headers as nginx passes them by default. Its Server header (its
    /// software and version, Apache/2.4.41 (Ubuntu), say) is not passed on, as by nginx and Envoy,
    /// unless Tern:Forwarding:PassServerHeader; Tern sends none of its own. A Location that points at
    /// the destination's own address (an app that builds redirects from the address it listens on,
    /// or from the Host it got where a route turns RequestHeaderOriginalHost off) becomes the path
    /// the client used, as nginx's proxy_redirect default does (a Refresh header's URL too), unless
    /// Tern:Forwarding:RewriteRedirects is off: on routes whose path reaches the upstream as the
    /// client sent it, with a prefix removed, added, or both, or filled into a PathPattern (see
    /// ClientTarget.RedirectsOf).
    /// First of the response transforms, so that a route may set its own.
    /// </summary>
    private sealed class UpstreamResponseHeaders(ActiveConfiguration active, ClientTarget.Redirects? redirects) : ResponseTransform
    {
        public override ValueTask ApplyAsync(ResponseTransformContext context)
        {
            if (context.ProxyResponse is { } answer && Unforwardable(answer, context.HttpContext.Request) is { } refusal)
            {
                throw new UnforwardableResponseException(refusal.Reason, refusal.Detail);
            }

            var settings = active.Current.Settings;
            var headers = context.HttpContext.Response.Headers;
            if (!settings.PassServerHeader)
            {
                headers.Remove(HeaderNames.Server);
            }

            if (redirects is null || !settings.RewriteRedirects)
            {
                return ValueTask.CompletedTask;
            }

            var location = headers.Location;
            var refresh = headers[Refresh]; // a miss in Kestrel's unknown headers: level in a paired A/B (loadtest/README.md, 2026-11-26 11:00)
            if ((location.Count == 1 || refresh.Count == 1)
                && context.HttpContext.Features.Get<IReverseProxyFeature>()?.ProxiedDestination?.Model.Config is { } destination)
            {
                var scheme = context.HttpContext.Request.Scheme;
                if (location.Count == 1 && Rewritten(location[0]!, destination, scheme, redirects, ClientLocation) is { } clientLocation)
                {
                    headers.Location = clientLocation;
                }

                if (refresh.Count == 1 && Rewritten(refresh[0]!, destination, scheme, redirects, ClientRefresh) is { } clientRefresh)
                {
                    headers[Refresh] = clientRefresh;
                }
            }

            return ValueTask.CompletedTask;
        }

        /// <summary>
        /// Why an upstream's answer cannot be passed on as it is, or null. A status below 100 (.NET
        /// reads "099" as 99, which went out as a status line of two digits, which clients refuse).
        /// A 2xx other than 101 to a WebSocket over HTTP/2 (the only CONNECT EdgeRequests lets
        /// through), which YARP sent an HTTP/1.1 upstream as an Upgrade: only a 101 takes it, and over
        /// HTTP/2 a 2xx says "taken". YARP passed it on: Kestrel refused a page on it (a 502 whose
        /// reason named the body), a 200 without one opened the WebSocket and closed it at once, and
        /// a 204 went through.
        /// </summary>
        private static (string Reason, string Detail)? Unforwardable(HttpResponseMessage answer, HttpRequest request) => (int)answer.StatusCode switch
        {
            < 100 and var status => ($"the upstream answered with status {status:000}, which clients cannot read (a status is from 100 to 999)", $"HTTP/{answer.Version} {status:000} {answer.ReasonPhrase}"),
            >= 200 and < 300 and var status when answer.Version.Major == 1 && HttpMethods.IsConnect(request.Method) =>
                ($"the upstream answered the WebSocket's request with {status}, not 101 Switching Protocols: it takes no WebSocket at this path", "a WebSocket over HTTP/2, sent to the upstream as an HTTP/1.1 Upgrade"),
            _ => null,
        };

        /// <summary>
        /// The value made the client's for the destination's address, or, where the destination
        /// gives its own Host (an app builds its redirects from the Host it got), for that name with
        /// the address's path: under the client's own scheme, or http for an HTTPS client (an app
        /// that sees plain HTTP). An https one for a plain-HTTP client (an app sending it to TLS) is
        /// left alone: made a path, it would send the client back where it was, again and again.
        /// Null where it points elsewhere.
        /// </summary>
        private static string? Rewritten(string value, DestinationConfig destination, string scheme, ClientTarget.Redirects redirects, Func<string, string, ClientTarget.Redirects, string?> rewrite)
        {
            var own = rewrite(value, destination.Address, redirects);
            if (own is not null || destination.Host is not { Length: > 0 } host)
            {
                return own;
            }

            var path = Uri.TryCreate(destination.Address, UriKind.Absolute, out var address) ? address.AbsolutePath : "/";
            return rewrite(value, $"{scheme}://{host}{path}", redirects)
                ?? (scheme == Uri.UriSchemeHttps ? rewrite(value, $"http://{host}{path}", redirects) : null);
        }
    }

    /// <summary>
    /// What the client's path for a Location at the destination's address, under the path the route
    /// sends there (see ClientTarget.Redirects), is, or null for a Location elsewhere: its scheme
    /// and host in any case, its path as written. http://10.0.0.5:8080/login from the destination
    /// http://10.0.0.5:8080/ is /login, or /app/login where the route removed the prefix /app.
    /// </summary>
    internal static string? ClientLocation(string location, string address, ClientTarget.Redirects redirects)
    {
        var origin = address.AsSpan().TrimEnd('/');
        var authority = origin.IndexOf("://", StringComparison.Ordinal) + 3;
        var pathStart = authority < 3 || origin[authority..].IndexOf('/') is var slash && slash < 0 ? origin.Length : authority + slash;
        var under = string.Concat(origin[pathStart..], redirects.Upstream);
        if (location.Length < pathStart + under.Length
            || !location.AsSpan(0, pathStart).Equals(origin[..pathStart], StringComparison.OrdinalIgnoreCase)
            || !location.AsSpan(pathStart).StartsWith(under, StringComparison.Ordinal))
        {
            return null;
        }

        var rest = location.AsSpan(pathStart + under.Length);
        if (rest.Length > 0 && rest[0] is not ('/' or '?' or '#'))
        {
            return null; // http://10.0.0.5:80801/, another port; /v22 under /v2
        }

        // A browser reads a path that starts //, or /\ (and one with a tab or line break, which
        // it strips), as another host: http://app/\evil.com/x must not become /\evil.com/x.
        var path = redirects.Pattern is { } pattern ? Unfilled(pattern, rest)
            : rest.Length > 0 && rest[0] == '/' ? string.Concat(redirects.Client, rest.TrimStart('/'))
            : redirects.Bare is { } bare ? string.Concat(bare, rest)
            : null;
        return path is null || path.StartsWith("//", StringComparison.Ordinal) || path.StartsWith("/\\", StringComparison.Ordinal) || path.AsSpan().IndexOfAnyInRange('\0', '\x1f') >= 0 ? null : path;
    }

    /// <summary>The client's path for the upstream's (with its query or fragment, kept as they are) on a PathPattern's route, or null.</summary>
    private static string? Unfilled(RawPattern pattern, ReadOnlySpan<char> rest)
    {
        var end = rest.IndexOfAny('?', '#');
        var path = end < 0 ? rest : rest[..end];
        return path.Length > 0 && pattern.Fill(path.ToString()) is { } client ? string.Concat(client, rest[path.Length..]) : null;
    }

    /// <summary>
    /// A Refresh header (<c>5; url=http://10.0.0.5:8080/login</c>, HTML's meta refresh as a header,
    /// which nginx's proxy_redirect rewrites too) with its URL made the client's as for a Location,
    /// or null where it has none at the destination's address. The URL is the one a browser goes to,
    /// read by HTML's declarative refresh steps: after the delay (digits and dots) and a ';' or ','
    /// (or white space), an optional <c>url=</c> (any case, white space around the <c>=</c>), then
    /// the URL in quotes or to the end. So <c>0; http://app/x</c> has one, and in
    /// <c>0; http://app/go?url=/x</c> it is the whole address, not what follows the inner "url=".
    /// </summary>
    private static readonly SearchValues<char> s_refreshDelay = SearchValues.Create("0123456789.");

    internal static string? ClientRefresh(string refresh, string address, ClientTarget.Redirects redirects)
    {
        var at = SkipWhite(refresh, 0);
        var digits = refresh.AsSpan(at).IndexOfAnyExceptInRange('0', '9');
        if (digits == 0 && refresh[at] != '.')
        {
            return null; // no delay: HTML ignores the header
        }

        at = refresh.AsSpan(at).IndexOfAnyExcept(s_refreshDelay) is var past and >= 0 ? at + past : refresh.Length;
        if (at < refresh.Length && refresh[at] is not (';' or ',') && !IsWhite(refresh[at]))
        {
            return null; // "5x": HTML ignores the header
        }

        at = SkipWhite(refresh, at);
        if (at < refresh.Length && refresh[at] is ';' or ',')
        {
            at = SkipWhite(refresh, at + 1);
        }

        if (at < refresh.Length && refresh.AsSpan(at).StartsWith("url", StringComparison.OrdinalIgnoreCase))
        {
            var equals = SkipWhite(refresh, at + 3);
            if (equals < refresh.Length && refresh[equals] == '=')
            {
                at = SkipWhite(refresh, equals + 1);
            }
        }

        var end = refresh.Length;
        if (at < refresh.Length && refresh[at] is '\'' or '"')
        {
            var closing = refresh.IndexOf(refresh[at], at + 1);
            end = closing < 0 ? refresh.Length : closing;
            at++;
        }

        return at < end && ClientLocation(refresh[at..end], address, redirects) is { } location
            ? string.Concat(refresh.AsSpan(0, at), location, refresh.AsSpan(end))
            : null;
    }

    /// <summary>Where the first character at or after from that is not HTML's white space is.</summary>
    private static int SkipWhite(string text, int from)
    {
        var rest = text.AsSpan(from).IndexOfAnyExcept(" \t\n\f\r");
        return rest < 0 ? text.Length : from + rest;
    }

    private static bool IsWhite(char c) => c is ' ' or '\t' or '\n' or '\f' or '\r';

    private sealed class ClientForwardedHeaders(ActiveConfiguration active) : RequestTransform
    {
        public override ValueTask ApplyAsync(RequestTransformContext context)
        {
            var request = context.HttpContext.Request;
            var client = context.HttpContext.Connection.RemoteIpAddress;
            var trusted = FromTrustedProxy(context, active);

            // From an untrusted client these are already gone (UntrustedForwardedHeaders).
            var incomingFor = TakeHeader(context, ForwardedFor);
            var incomingProto = TakeHeader(context, ForwardedProto);
            var incomingHost = TakeHeader(context, ForwardedHost);
            TakeHeader(context, ForwardedPrefix);

            var clientText = client is null ? "unknown" : Plain(client).ToString();
            AddHeader(context, ForwardedFor, trusted && !StringValues.IsNullOrEmpty(incomingFor) ? StringValues.Concat(incomingFor, clientText) : clientText);
            AddHeader(context, ForwardedProto, trusted && !StringValues.IsNullOrEmpty(incomingProto) ? incomingProto : request.Scheme);
            // The Host as the client sent it: Request.Host decodes a punycode name (xn--bcher-kva.example
            // became bücher.example, sent as Latin-1 bytes).
            var host = request.Headers.Host;
            if (!StringValues.IsNullOrEmpty(host))
            {
                AddHeader(context, ForwardedHost, trusted && !StringValues.IsNullOrEmpty(incomingHost) ? incomingHost : host);
            }

            if (request.PathBase.HasValue)
            {
                AddHeader(context, ForwardedPrefix, request.PathBase.Value);
            }

            return ValueTask.CompletedTask;
        }
    }
}

/// <summary>An upstream's answer that Tern cannot pass on as it is; the message says why, for the client and the log.</summary>
internal sealed class UnforwardableResponseException(string reason, string detail) : Exception(reason)
{
    /// <summary>What the upstream sent, for the log line.</summary>
    public string Detail { get; } = detail;
}
