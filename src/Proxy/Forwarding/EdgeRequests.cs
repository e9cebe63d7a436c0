using System.Globalization;
using Microsoft.AspNetCore.Http;
using Microsoft.AspNetCore.Http.Features;
using Microsoft.Extensions.Primitives;
using Microsoft.Net.Http.Headers;

namespace Tern.Proxy.Forwarding;

/// <summary>
/// What Tern answers itself, before routing, to requests it will not forward, and to requests the
/// router cannot place.
/// </summary>
/// <remarks>
/// <para>
/// A field that takes one value given twice is refused with 400 (see Repeated). A request
/// without a Host (HTTP/1.0, or an empty <c>Host:</c>) is refused with 400, as nginx does: .NET's client would send the upstream the destination's own address as its Host (an
/// internal address, which applications put into the URLs they build), and, for an empty one,
/// that beside the empty Host: two Hosts, which upstreams and caches read differently. A Host
/// whose punycode does not decode is refused with 400 too (see Decodes), and so is a path with a
/// '..' segment an upstream could resolve (see HasParentSegment), and an HTTP/2 target with raw
/// bytes above 0x7F (see HasRawBytes).
/// </para>
/// <para>
/// A request body framed otherwise than by chunked alone is refused, with 501 (400 for HTTP/1.0),
/// as nginx refuses it (see RefusedFraming).
/// TRACE is refused with 405, as nginx does: an upstream that answers it (Apache's default) echoes
/// the request back, with its cookies, its Authorization and the X-Forwarded headers Tern adds.
/// CONNECT is refused with 405 too, as nginx does: Tern is no forward proxy, and YARP, which does
/// not tunnel it, failed each one as a 502 that blamed the upstream, with a warning logged (any
/// client could fill the log so). HTTP/2's extended CONNECT for a WebSocket is forwarded; for any
/// other protocol it is refused alike, since YARP would fail it the same way. A method that
/// differs only in case from one .NET's client knows ('head') is refused with 501 (see Sent).
/// </para>
/// <para>
/// OPTIONS * asks about the server, not a resource (RFC 9110, 9.3.7), and .NET's client cannot
/// send a '*' target: YARP sent the upstream OPTIONS /, a question about its root (a CORS
/// preflight, say). Tern, the server the client talks to, answers it: 200 without content. So it
/// does an absolute URL with neither a path nor a query (OPTIONS http://host), which the last
/// proxy is to send on as * (RFC 9112, 3.2.4), and which YARP sent as OPTIONS / too. An OPTIONS
/// with Max-Forwards is one a client traces hop by hop (RFC 9110, 7.6.2): at 0 Tern is the last
/// recipient and answers it alike; above, the upstream gets it one lower (before, it got the
/// client's value, and at 0 the request). TRACE, the other method it applies to, is refused.
/// </para>
/// <para>
/// A request that two routes match alike gets a 500 that says so and one log line naming them,
/// instead of the router's exception: Kestrel's error with a stack trace for every such request,
/// which a client could cause at will where routes differ only in headers it sends (X-A: 1 for one
/// route, X-B: 1 for another, and a request with both).
/// Routes that collide on every request they match are refused at start (Configuration's
/// DuplicateRoutes); these are the pairs that collide on some requests only. The router fails
/// while it matches, before any response, and without awaiting anything (a throw, or a task
/// already faulted), so this looks at the rest of the pipeline's call without an await of its
/// own: nothing is added to a request that is not ambiguous.
/// </para>
/// </remarks>
internal static class EdgeRequests
{
    /// <summary>The router's exception, internal to ASP.NET Core, so known by its name.</summary>
    private const string RouterAmbiguity = "Microsoft.AspNetCore.Routing.Matching.AmbiguousMatchException";

    public static Task InvokeAsync(HttpContext context, RequestDelegate next)
    {
        var request = context.Request;
        if (request.Headers.TransferEncoding.Count > 0 && RefusedFraming(request) is { } refused)
        {
            return ProxyErrorResponses.RespondAsync(context, refused.Status, refused.Reason, close: true);
        }

        var host = request.Headers.Host;
        if (StringValues.IsNullOrEmpty(host))
        {
            return ProxyErrorResponses.RespondAsync(context, StatusCodes.Status400BadRequest, "a Host header is required");
        }

        if (Repeated(request.Headers) is { } field)
        {
            return ProxyErrorResponses.RespondAsync(context, StatusCodes.Status400BadRequest, $"the request has more than one {field} header, a field that takes one value");
        }

        if (!Decodes(request, host.ToString()))
        {
            return ProxyErrorResponses.RespondAsync(context, StatusCodes.Status400BadRequest, "the Host header's name is not valid punycode (xn--)");
        }

        if (HasParentSegment(request.Path.Value))
        {
            return ProxyErrorResponses.RespondAsync(context, StatusCodes.Status400BadRequest, "the target's path has a '..' segment that an upstream could resolve to a path Tern did not route (beside an escaped '/', a '\\' or a ';')");
        }

        if (HttpProtocol.IsHttp2(request.Protocol) && HasRawBytes(context))
        {
            return ProxyErrorResponses.RespondAsync(context, StatusCodes.Status400BadRequest, "the target holds bytes above 0x7F unescaped; percent-encode them");
        }

        if (HttpMethods.IsTrace(request.Method))
        {
            return ProxyErrorResponses.RespondAsync(context, StatusCodes.Status405MethodNotAllowed, "Tern does not forward TRACE, whose answer would echo the request's cookies and credentials");
        }

        if (HttpMethods.IsConnect(request.Method) && !IsWebSocket(context.Features.Get<IHttpExtendedConnectFeature>()))
        {
            return ProxyErrorResponses.RespondAsync(context, StatusCodes.Status405MethodNotAllowed, "Tern is a reverse proxy and does not tunnel CONNECT (HTTP/2's extended CONNECT, for WebSockets only)");
        }

        if (Sent(request.Method) is { } sent)
        {
            return ProxyErrorResponses.RespondAsync(context, StatusCodes.Status501NotImplemented, $"the method '{request.Method}' is not {sent} (methods are case-sensitive), and Tern's HTTP client would send it as {sent}");
        }

        if (request.Path.Value is "" or "/" && HttpMethods.IsOptions(request.Method) && AsksAboutTheServer(context.Features.Get<IHttpRequestFeature>()?.RawTarget))
        {
            context.Response.ContentLength = 0;
            return Task.CompletedTask;
        }

        if (request.Headers.MaxForwards.Count > 0 && HttpMethods.IsOptions(request.Method))
        {
            if (Hops(request.Headers.MaxForwards) is not { } hops)
            {
                return ProxyErrorResponses.RespondAsync(context, StatusCodes.Status400BadRequest, "Max-Forwards must be one number, the hops the request may still be forwarded (RFC 9110, 7.6.2)");
            }

            if (hops == 0)
            {
                context.Response.ContentLength = 0;
                return Task.CompletedTask;
            }

            request.Headers.MaxForwards = (hops - 1).ToString(CultureInfo.InvariantCulture);
        }

        Task rest;
        try
        {
            rest = next(context);
        }
        catch (Exception thrown) when (IsAmbiguity(thrown, context))
        {
            return AnswerAsync(context, thrown);
        }

        // With a route that matches on headers or query parameters, the router's policies run
        // in an async method: the exception comes back as a task already faulted.
        return rest.IsFaulted && rest.Exception.InnerException is { } inner && IsAmbiguity(inner, context) ? AnswerAsync(context, inner) : rest;
    }

    /// <summary>
    /// Whether ASP.NET Core can read the Host: Request.Host decodes a punycode label (xn--) and
    /// throws where it does not decode (xn--zz.example), which the router's host matching, YARP's
    /// original-Host transform and Tern's own lines all ask for: a 500 with a stack trace that any
    /// client could cause. Only a Host with such a label is decoded here.
    /// </summary>
    private static bool Decodes(HttpRequest request, string host)
    {
        if (!host.Contains("xn--", StringComparison.OrdinalIgnoreCase))
        {
            return true;
        }

        try
        {
            _ = request.Host.Value;
            return true;
        }
        catch (ArgumentException)
        {
            return false;
        }
    }

    /// <summary>
    /// A field that takes one value, given on more than one line. Kestrel joins the lines with
    /// ", " and .NET's client sends them so: two Authorization lines reached the upstream as
    /// 'Basic a, Bearer b', a credential neither line gave, two Range lines as a request for both
    /// ranges, two Content-Types as a media type that is none. A server or a check before Tern
    /// reads one of the lines, the upstream something else. 400, as nginx answers the
    /// Authorization, conditional and Content-Range ones (it passes the others on as two lines,
    /// which .NET cannot send); Origin too, which a check against cross-site requests reads.
    /// One line with commas is the client's own value, and passes; so do lines that all say the
    /// same (PHP code that merges header arrays sends a Content-Type twice), forwarded as one.
    /// </summary>
    private static string? Repeated(IHeaderDictionary headers)
    {
        // Kestrel's own properties first: a field read, where a look-up by name compares names.
        if (headers.Authorization.Count < 2 && headers.ContentType.Count < 2 && headers.Range.Count < 2 && headers.IfRange.Count < 2
            && headers.IfModifiedSince.Count < 2 && headers.IfUnmodifiedSince.Count < 2 && headers.ContentRange.Count < 2 && headers.Origin.Count < 2)
        {
            return null;
        }

        foreach (var name in s_oneValue)
        {
            var lines = headers[name];
            if (lines.Count < 2)
            {
                continue;
            }

            foreach (var line in lines)
            {
                if (!string.Equals(line, lines[0], StringComparison.Ordinal))
                {
                    return name;
                }
            }

            headers[name] = lines[0];
        }

        return null;
    }

    private static readonly string[] s_oneValue =
    [
        HeaderNames.Authorization, HeaderNames.ContentType, HeaderNames.Range, HeaderNames.IfRange,
        HeaderNames.IfModifiedSince, HeaderNames.IfUnmodifiedSince, HeaderNames.ContentRange, HeaderNames.Origin,
    ];

    /// <summary>
    /// Whether the decoded path has a ".." segment an upstream could resolve, which Kestrel, having
    /// resolved the target's before routing, leaves: one an absolute URL's %2F left (Kestrel decodes
    /// it there after resolving, so https://host/public%2F..%2Fadmin was routed as
    /// /public/../admin under /public/{**rest}, and .NET's client sent /admin), or one beside a
    /// %2F that Kestrel keeps, a '\' (which IIS takes for '/'), or before a ';' (Tomcat and Jetty
    /// drop a segment's parameters: /public/..;/admin is their /admin). nginx passes these on;
    /// Tern's routes confine what reaches an upstream, so it refuses them. Only a path with ".." is split.
    /// </summary>
    private static bool HasParentSegment(string? path)
    {
        if (path is null || !path.Contains("..", StringComparison.Ordinal))
        {
            return false;
        }

        foreach (var segment in path.Replace("%2F", "/", StringComparison.OrdinalIgnoreCase).Split('/', '\\'))
        {
            var parameters = segment.IndexOf(';', StringComparison.Ordinal);
            if ((parameters < 0 ? segment : segment[..parameters]) == "..")
            {
                return true;
            }
        }

        return false;
    }

    /// <summary>
    /// Whether an HTTP/2 target holds bytes above 0x7F, unescaped (curl sends a query's UTF-8 so).
    /// Kestrel refuses them over HTTP/1.1 (400); over HTTP/2 it reads them one character a byte,
    /// so routes matched on other characters than the client meant (a route on /café never matched
    /// its raw UTF-8), and YARP encoded each again as UTF-8: é reached the upstream as %C3%83%C2%A9.
    /// </summary>
    private static bool HasRawBytes(HttpContext context) =>
        context.Features.Get<IHttpRequestFeature>()?.RawTarget is { } target && target.AsSpan().ContainsAnyExceptInRange('\0', '\x7f');

    /// <summary>
    /// A request body framed otherwise than by chunked alone, which Kestrel reads as if it were:
    /// it decodes the last coding, chunked, and passes over the ones before it, so the body of
    /// 'Transfer-Encoding: gzip, chunked' reached the upstream still compressed and said to be
    /// plain (and 'chunked, chunked' half decoded). RFC 9112 (6.1) asks for 501 for a coding a
    /// server does not decode, and has an HTTP/1.0 request's Transfer-Encoding taken as framing
    /// gone wrong, which Kestrel read as chunked (and a server before Tern may read by its
    /// Content-Length: a way to smuggle a request). Both as nginx answers them (501 and 400; 400
    /// for two Transfer-Encoding lines too), and the connection closed, since the body's end is in
    /// doubt. HTTP/2 frames a body itself: a
    /// transfer-encoding there, which Kestrel accepts, is not forwarded, and not looked at.
    /// </summary>
    private static (int Status, string Reason)? RefusedFraming(HttpRequest request)
    {
        if (HttpProtocol.IsHttp10(request.Protocol))
        {
            return (StatusCodes.Status400BadRequest, "an HTTP/1.0 request cannot be framed by Transfer-Encoding (RFC 9112, 6.1)");
        }

        if (!HttpProtocol.IsHttp11(request.Protocol))
        {
            return null; // HTTP/2 frames a body itself; Kestrel accepts the header there, and it is not forwarded
        }

        if (request.Headers.TransferEncoding.Count > 1)
        {
            return (StatusCodes.Status400BadRequest, "the request has more than one Transfer-Encoding header");
        }

        // A list: empty elements are no coding (RFC 9110, 5.6.1); only spaces and tabs are white.
        var codings = 0;
        var chunked = true;
        foreach (var line in request.Headers.TransferEncoding)
        {
            var list = line.AsSpan();
            foreach (var element in list.Split(','))
            {
                var coding = list[element].Trim(" \t");
                if (coding.Length > 0)
                {
                    codings++;
                    chunked &= coding.Equals("chunked", StringComparison.OrdinalIgnoreCase);
                }
            }
        }

        return codings == 1 && chunked
            ? null
            : (StatusCodes.Status501NotImplemented, "Tern decodes no transfer coding but chunked, and this request's Transfer-Encoding names another, or chunked twice");
    }

    /// <summary>
    /// Whether .NET's client would send another method than the client's: it reads the methods it
    /// knows (GET, HEAD, QUERY, ...) in any case, and sends them in capitals. Methods are
    /// case-sensitive (RFC 9110, 9.1), so 'head' is not HEAD; Kestrel reads it so, and answered a
    /// 'head' with the upstream's answer to HEAD, then failed it as a 500 for the body that answer
    /// promised. nginx refuses any method with a small letter (400); Tern, only those its client
    /// would change, with 501 (a method it cannot forward), and forwards 'propfind' as written.
    /// Returns the method the client would send where it is not the request's, else null.
    /// </summary>
    private static string? Sent(string method) =>
        HttpMethod.Parse(method).Method is var sent && string.Equals(sent, method, StringComparison.Ordinal) ? null : sent;

    /// <summary>An HTTP/2 extended CONNECT for a WebSocket, which YARP forwards (as YARP tells it: the protocol's name in any case).</summary>
    private static bool IsWebSocket(IHttpExtendedConnectFeature? connect) =>
        connect is { IsExtendedConnect: true } && string.Equals(connect.Protocol, "websocket", StringComparison.OrdinalIgnoreCase);

    /// <summary>An OPTIONS target about the server: *, or an absolute URL with neither a path nor a query.</summary>
    private static bool AsksAboutTheServer(string? target) =>
        target == "*" || (target?.IndexOf("://", StringComparison.Ordinal) is > 0 and var scheme && target.AsSpan(scheme + 3).IndexOfAny('/', '?') < 0);

    /// <summary>The hops a Max-Forwards allows, digits (int.MaxValue for more), or null; lines alike are one, as Repeated takes them.</summary>
    private static int? Hops(StringValues lines)
    {
        var value = lines.All(line => line == lines[0]) ? lines[0].AsSpan().Trim(" \t") : [];
        if (value.IsEmpty || value.ContainsAnyExceptInRange('0', '9'))
        {
            return null;
        }

        return int.TryParse(value, NumberStyles.None, CultureInfo.InvariantCulture, out var hops) ? hops : int.MaxValue;
    }

    private static bool IsAmbiguity(Exception exception, HttpContext context) =>
        exception.GetType().FullName == RouterAmbiguity && !context.Response.HasStarted;

    private static Task AnswerAsync(HttpContext context, Exception ambiguity)
    {
        // "The request matched multiple endpoints. Matches: \n\nroute-a\nroute-b": one line.
        var routes = string.Join(", ", ambiguity.Message.Split('\n', StringSplitOptions.RemoveEmptyEntries | StringSplitOptions.TrimEntries).Skip(1));
        TernLog.RoutesAmbiguous(ProxyErrorResponses.Logger(context), context.Request.Method, context.Request.Path, routes);
        return ProxyErrorResponses.RespondAsync(context, StatusCodes.Status500InternalServerError, "more than one route matches this request alike, and none was chosen");
    }
}
