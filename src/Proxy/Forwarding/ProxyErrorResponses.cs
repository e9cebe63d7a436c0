using System.Net.Sockets;
using Microsoft.AspNetCore.Connections;
using Microsoft.AspNetCore.Http;
using Microsoft.AspNetCore.Http.Features;
using Microsoft.AspNetCore.Http.Timeouts;
using Microsoft.AspNetCore.WebUtilities;
using Microsoft.Extensions.Logging;
using Tern.Proxy.Configuration;
using Yarp.ReverseProxy.Configuration;
using Yarp.ReverseProxy.Forwarder;

namespace Tern.Proxy.Forwarding;

/// <summary>
/// Turns YARP's forwarding errors into statuses an operator can act on, each with a short
/// plain-text reason: 502 when the upstream refused or could not be reached, 504 when it did not
/// answer in time, 503 when a cluster has no destination left or Tern may open no more connections, Kestrel's status (400, 408, 413) when
/// it refused the client's request body, and 499 (logged, never sent) when the client went away before its response began
/// (after, the line names the status it got). Reasons name the cluster, never an internal address.
/// </summary>
internal static class ProxyErrorResponses
{
    /// <summary>Status logged when the client closed the connection before the response (nginx's convention).</summary>
    public const int ClientClosedRequest = 499;

    public static async Task InvokeAsync(HttpContext context, RequestDelegate next)
    {
        await next(context);

        var error = context.GetForwarderErrorFeature();
        if (error is null)
        {
            // A 204 has no body (RFC 9110, 8.6), so an upstream's Content-Length on it is wrong, and
            // Kestrel would turn it into a 500 with an error logged ("too few bytes written") when
            // it completes the response. nginx drops it; so does Tern. A 204's headers are still
            // unsent here, and only a 204 pays for the check.
            if (context.Response.StatusCode == StatusCodes.Status204NoContent && !context.Response.HasStarted && context.Response.ContentLength > 0)
            {
                context.Response.ContentLength = null;
            }

            return;
        }

        var proxy = context.GetReverseProxyFeature();
        var route = proxy.Route.Config.RouteId;

        // The route's Timeout (ASP.NET Core's request timeout) cancels the token YARP and Tern read
        // as the client's: then it does not mean the client left, nor that shutdown cut the request.
        var timedOut = context.Features.Get<IHttpRequestTimeoutFeature>()?.RequestTimeoutToken.IsCancellationRequested == true;
        var clientGone = context.RequestAborted.IsCancellationRequested && !timedOut;
        if (clientGone && context.RequestServices.GetRequiredService<Microsoft.Extensions.Hosting.IHostApplicationLifetime>().ApplicationStopping.IsCancellationRequested)
        {
            TernLog.CutByShutdown(Logger(context), context.Request.Method, context.Request.Path, route);
            return;
        }

        // An upstream may answer before it has read the request body (an HTTP/2 upstream refusing
        // an upload, say). YARP then copies the whole response and only after it reports the body's
        // copy as failed, with the body's own exception; a request body that failed while the
        // response did, or before it came, comes wrapped in an AggregateException with the other
        // failure. So with no AggregateException the client got its whole answer, begun or not (a
        // 401 or 413 without content has not started yet): nothing failed that it or the upstream
        // should hear about.
        var answeredWhole = error.Exception is not AggregateException;
        if (answeredWhole && (error.Error is ForwarderError.RequestBodyDestination
            || (!clientGone && error.Error is ForwarderError.RequestBodyClient or ForwarderError.RequestBodyCanceled)))
        {
            return;
        }

        var cluster = proxy.Cluster.Config;
        var destination = proxy.ProxiedDestination?.DestinationId ?? "-";
        if (timedOut)
        {
            // Which side was still at it when the Timeout ran out: the client sending its body
            // (408, as nginx's client_body_timeout), the client reading the response, or the
            // upstream (504; once the response began, it is cut: YARP resets the client then).
            var failure = error.Error switch
            {
                ForwarderError.RequestBodyClient or ForwarderError.RequestBodyCanceled =>
                    (Status: StatusCodes.Status408RequestTimeout, Reason: "the client did not finish sending the request body within the route's Timeout"),
                ForwarderError.ResponseBodyClient when context.Response.HasStarted =>
                    (Status: StatusCodes.Status504GatewayTimeout, Reason: "the client did not read the whole response within the route's Timeout"),
                _ => (Status: StatusCodes.Status504GatewayTimeout, Reason: $"the upstream of cluster '{cluster.ClusterId}' did not complete the response within the route's Timeout"),
            };
            var close = failure.Status == StatusCodes.Status408RequestTimeout && HttpProtocol.IsHttp11(context.Request.Protocol); // the rest of the body cannot be framed
            await UpstreamFailedAsync(failure, $"route Timeout {proxy.Route.Config.Timeout}", close);
            return;
        }

        if (error.Error == ForwarderError.UpgradeActivityTimeout)
        {
            // An upgraded connection (a WebSocket) that carried nothing either way for the
            // cluster's activity timeout: YARP closed it, as configured. Not a failure.
            TernLog.UpgradeIdleClosed(Logger(context), context.Request.Method, context.Request.Path, route, cluster.ClusterId, destination);
            return;
        }

        // A client that stopped reading the response: YARP's activity timeout cancelled a write to
        // it, which YARP reports as the client's side failing with a cancellation (a client that
        // left shows as ResponseBodyCanceled, when RequestAborted cancels the copy, or as the
        // write's I/O error). Kestrel aborts a connection whose write was cancelled, so
        // RequestAborted is set here too on the SslStream engine: it does not mean the client left.
        // (Should that abort reach YARP's copy before YARP reads why it was cancelled, YARP reports
        // ResponseBodyCanceled and this is logged as a client that went away, event 307; not seen
        // in about 130 tries.)
        if (error.Error == ForwarderError.ResponseBodyClient
            && Find<OperationCanceledException>(error.Exception) is { } cancelled && cancelled is not ConnectionAbortedException)
        {
            TernLog.ClientStoppedReading(Logger(context), context.Request.Method, context.Request.Path, context.Response.StatusCode, route, cluster.ClusterId, destination);
            context.Abort();
            return;
        }

        // The upstream failed after the response began: it closed, reset or went silent mid-body.
        // YARP then aborts the client's request itself, so that the client cannot take the part for
        // the whole, which makes the client look gone: the failure is the upstream's.
        if (context.Response.HasStarted && error.Error is ForwarderError.ResponseBodyDestination or ForwarderError.UpgradeResponseDestination or ForwarderError.UpgradeRequestDestination or ForwarderError.RequestBodyDestination)
        {
            await UpstreamFailedAsync(Describe(error.Error, error.Exception, cluster));
            return;
        }

        // Kestrel refused the upstream's response before its headers went out: a 205 with content,
        // which a 205 may not have (Express's sendStatus(205) sends its reason phrase), is one.
        // YARP reports it as the client's side failing and sets 502; the fault is the upstream's.
        if (error.Error == ForwarderError.ResponseBodyClient && !context.Response.HasStarted && !clientGone
            && Find<InvalidOperationException>(error.Exception) is { } refused and not ObjectDisposedException)
        {
            await UpstreamFailedAsync((StatusCodes.Status502BadGateway, $"the upstream sent a response that cannot be passed on: {refused.Message} (cluster '{cluster.ClusterId}')"));
            return;
        }

        // An answer Tern's response transform found it cannot pass on (EdgeForwardedHeaders).
        if (error.Error == ForwarderError.ResponseHeaders && error.Exception is UnforwardableResponseException unforwardable)
        {
            await UpstreamFailedAsync((StatusCodes.Status502BadGateway, $"{unforwardable.Message} (cluster '{cluster.ClusterId}')"), unforwardable.Detail);
            return;
        }

        // An upstream that switched protocols (101) for a request that asked for no upgrade: Kestrel
        // refuses to switch, and YARP reports that as the client's side failing.
        if (error.Error is ForwarderError.UpgradeRequestClient or ForwarderError.UpgradeResponseClient && !context.Response.HasStarted
            && context.Features.Get<IHttpUpgradeFeature>()?.IsUpgradableRequest != true)
        {
            await UpstreamFailedAsync((StatusCodes.Status502BadGateway, $"the upstream switched protocols (101) for a request that asked for no upgrade (cluster '{cluster.ClusterId}')"));
            return;
        }

        // The client's side failed, not the upstream's: a body Kestrel refused (malformed 400, too
        // large 413, too slow 408) is answered with Kestrel's status; any other failure there is a
        // client that went away (499).
        var clientSide = error.Error is ForwarderError.RequestBodyClient or ForwarderError.ResponseBodyClient or ForwarderError.UpgradeRequestClient or ForwarderError.UpgradeResponseClient;
        var rejected = clientSide ? Rejection(error.Exception) : null;

        // The cluster's activity timeout ended a read of the request body: the client, still
        // connected, sent nothing more of it for that long. YARP says so by setting 408 (nginx's
        // client_body_timeout answers the same).
        if (rejected is null && error.Error == ForwarderError.RequestBodyClient && context.Response.StatusCode == StatusCodes.Status408RequestTimeout
            && Find<OperationCanceledException>(error.Exception) is not null)
        {
            rejected = (StatusCodes.Status408RequestTimeout, "the client sent nothing more of it within the cluster's HttpRequest:ActivityTimeout");
        }

        if (rejected is { } refusal && !context.Response.HasStarted && !context.RequestAborted.IsCancellationRequested)
        {
            TernLog.RequestBodyRejected(Logger(context), context.Request.Method, context.Request.Path, refusal.Status, refusal.Message, route);
            // Over HTTP/1.1, what follows the refused body cannot be framed: close.
            await RespondAsync(context, refusal.Status, $"the request body was rejected ({refusal.Message})", close: HttpProtocol.IsHttp11(context.Request.Protocol));
            return;
        }

        if (clientSide || clientGone || error.Error is ForwarderError.RequestCanceled or ForwarderError.RequestBodyCanceled or ForwarderError.ResponseBodyCanceled or ForwarderError.UpgradeRequestCanceled or ForwarderError.UpgradeResponseCanceled)
        {
            // Once the response has begun its status is on the wire (and in Kestrel's metrics), so
            // the line names it rather than a 499 the client never saw.
            if (context.Response.HasStarted)
            {
                TernLog.ClientLeftMidResponse(Logger(context), context.Request.Method, context.Request.Path, context.Response.StatusCode, route);
            }
            else
            {
                context.Response.StatusCode = ClientClosedRequest;
                TernLog.ClientClosedRequest(Logger(context), context.Request.Method, context.Request.Path, route);
            }

            // The client is gone or its side broke (a reset shows here before RequestAborted
            // does): end the connection now, rather than have Kestrel try to drain a request body
            // that will not come.
            context.Abort();
            return;
        }

        await UpstreamFailedAsync(Describe(error.Error, error.Exception, cluster));

        // The upstream's failure: answered with its status and reason, or, when part of the
        // upstream's response is already on the wire (YARP then reset the client), logged as cut.
        async Task UpstreamFailedAsync((int Status, string Reason) failure, string? detail = null, bool close = false)
        {
            if (context.Response.HasStarted)
            {
                TernLog.UpstreamCutResponse(Logger(context), context.Request.Method, context.Request.Path, context.Response.StatusCode, failure.Reason, route, cluster.ClusterId, destination, detail ?? Detail(error.Exception));
                return;
            }

            TernLog.UpstreamFailed(Logger(context), context.Request.Method, context.Request.Path, failure.Status, failure.Reason, route, cluster.ClusterId, destination, detail ?? Detail(error.Exception));
            await RespondAsync(context, failure.Status, failure.Reason, close);
        }
    }

    /// <summary>The plain-text answer: status, reason phrase and Tern's reason, never cached.</summary>
    internal static async Task RespondAsync(HttpContext context, int status, string reason, bool close = false)
    {
        context.Response.Clear();
        if (close && !HttpProtocol.IsHttp2(context.Request.Protocol) && !HttpProtocol.IsHttp3(context.Request.Protocol))
        {
            // HTTP/1.x only: Kestrel drops a Connection header from an HTTP/2 or HTTP/3 answer, with a warning.
            context.Response.Headers.Connection = "close";
        }

        context.Response.StatusCode = status;
        context.Response.ContentType = "text/plain; charset=utf-8";
        context.Response.Headers.CacheControl = "no-store";
        await context.Response.WriteAsync($"{status} {ReasonPhrases.GetReasonPhrase(status)}: {reason}\n");
    }

    /// <summary>
    /// The status and the reason the client reads, for an error on the upstream's side. Reasons say
    /// what the upstream did, so that an operator knows where to look: "could not be reached" only
    /// when no connection was made (a socket error). They name the cluster, never an internal address; the log line
    /// adds <see cref="Detail"/>.
    /// </summary>
    internal static (int Status, string Reason) Describe(ForwarderError error, Exception? exception, ClusterConfig config)
    {
        var cluster = config.ClusterId;
        if (error == ForwarderError.NoAvailableDestinations)
        {
            return (StatusCodes.Status503ServiceUnavailable, $"cluster '{cluster}' has no available destination");
        }

        // YARP reports an expired ConnectTimeout as RequestTimedOut; it is a connection failure (502).
        var connectTimedOut = Find<TimeoutException>(exception) is not null;
        if (error == ForwarderError.RequestTimedOut && !connectTimedOut)
        {
            return (StatusCodes.Status504GatewayTimeout, $"the upstream of cluster '{cluster}' did not respond in time");
        }

        // YARP's activity timeout cancels a response body's read that waited longer than it allows.
        if (error == ForwarderError.ResponseBodyDestination && Find<OperationCanceledException>(exception) is not null)
        {
            return (StatusCodes.Status504GatewayTimeout, $"the upstream of cluster '{cluster}' sent nothing more of its response within HttpRequest:ActivityTimeout");
        }

        var socketError = Find<SocketException>(exception)?.SocketErrorCode;
        if (IsOwnFileLimit(exception))
        {
            // Tern's own limit, not the upstream's fault: a connection to it is a file Tern may not
            // open now (README, "Listeners"). Overload, which a client may retry.
            return (StatusCodes.Status503ServiceUnavailable, $"Tern has as many connections open as its open-file limit allows; try again later (cluster '{cluster}')");
        }

        var midResponse = error is ForwarderError.ResponseBodyDestination or ForwarderError.UpgradeResponseDestination;
        // A cluster that allows no HTTP/1.1 (HttpRequest:Version 2 or 3 with VersionPolicy
        // RequestVersionExact or RequestVersionOrHigher): .NET sometimes loses why a new HTTP/2
        // connection failed ("the server did not complete the HTTP/2 handshake", no category).
        var newerVersionOnly = config.HttpRequest is { Version.Major: >= 2, VersionPolicy: HttpVersionPolicy.RequestVersionExact or HttpVersionPolicy.RequestVersionOrHigher };
        // Through a cluster's forward proxy, the connection that failed is the proxy's.
        var peer = config.HttpClient?.WebProxy?.Address is null ? "the upstream" : "the cluster's HttpClient:WebProxy";
        var reason = socketError switch
        {
            SocketError.ConnectionRefused => $"{peer} refused the connection",
            SocketError.HostUnreachable or SocketError.NetworkUnreachable => $"{peer} is unreachable",
            SocketError.HostNotFound or SocketError.NoData or SocketError.TryAgain => $"{peer}'s host name does not resolve",
            SocketError.ConnectionReset or SocketError.ConnectionAborted => $"{peer} closed the connection",
            _ when connectTimedOut => config.Metadata?.ContainsKey(ReverseProxyValidator.ConnectTimeoutMetadata) == true
                ? $"{peer} did not accept the connection within the cluster's Metadata:{ReverseProxyValidator.ConnectTimeoutMetadata}"
                : $"{peer} did not accept the connection within Tern:Forwarding:ConnectTimeout",
            _ => HttpRequestErrorOf(exception) switch
            {
                HttpRequestError.NameResolutionError => "the upstream's host name does not resolve",
                HttpRequestError.SecureConnectionError => "Tern could not set up TLS with the upstream",
                HttpRequestError.VersionNegotiationError => "the upstream does not speak the HTTP version the cluster's HttpRequest:Version and VersionPolicy require",
                HttpRequestError.HttpProtocolError when Find<HttpProtocolException>(exception) is { } protocol => $"HTTP/2 with the upstream failed ({Http2ErrorName(protocol.ErrorCode)})",
                HttpRequestError.HttpProtocolError => "HTTP/2 with the upstream failed",
                HttpRequestError.InvalidResponse => "the upstream sent an invalid response",
                HttpRequestError.ConfigurationLimitExceeded => "the upstream's response headers are larger than the 64 KB Tern accepts",
                HttpRequestError.ResponseEnded when midResponse => "the upstream closed the connection before its response ended",
                HttpRequestError.ResponseEnded => "the upstream closed the connection without answering",
                _ when error is ForwarderError.ResponseHeaders => "the upstream sent an invalid response",
                _ when newerVersionOnly && error is ForwarderError.Request => "HTTP/2 with the upstream failed",
                _ when midResponse => "the upstream's response failed part-way",
                // A connection that failed gives a socket error; without one, .NET said nothing more.
                _ when socketError is not null => "the upstream could not be reached",
                _ => "the request to the upstream failed",
            },
        };
        return (StatusCodes.Status502BadGateway, $"{reason} (cluster '{cluster}')");
    }

    /// <summary>An HTTP/2 error code's name (RFC 9113, 7): what the upstream reset a stream with, or what .NET found wrong.</summary>
    private static string Http2ErrorName(long code) => code switch
    {
        0x0 => "NO_ERROR",
        0x1 => "PROTOCOL_ERROR",
        0x2 => "INTERNAL_ERROR",
        0x3 => "FLOW_CONTROL_ERROR",
        0x4 => "SETTINGS_TIMEOUT",
        0x5 => "STREAM_CLOSED",
        0x6 => "FRAME_SIZE_ERROR",
        0x7 => "REFUSED_STREAM",
        0x8 => "CANCEL",
        0x9 => "COMPRESSION_ERROR",
        0xa => "CONNECT_ERROR",
        0xb => "ENHANCE_YOUR_CALM",
        0xc => "INADEQUATE_SECURITY",
        0xd => "HTTP_1_1_REQUIRED",
        _ => $"0x{code:x}",
    };

    /// <summary>.NET's category for a failed upstream call, from the first exception in the chain that carries one.</summary>
    private static HttpRequestError HttpRequestErrorOf(Exception? exception)
    {
        for (var e = exception; e is not null; e = e.InnerException)
        {
            var category = e switch
            {
                HttpRequestException request => request.HttpRequestError,
                HttpIOException io => io.HttpRequestError,
                _ => HttpRequestError.Unknown,
            };
            if (category != HttpRequestError.Unknown)
            {
                return category;
            }
        }

        return HttpRequestError.Unknown;
    }

    /// <summary>
    /// For the log line: the innermost exception's message, which says what .NET saw ("The remote
    /// certificate is invalid because of errors in the certificate chain: UntrustedRoot", "Received
    /// an invalid status line: ..."). It may quote the upstream, so control characters are replaced
    /// and it is cut at 300 characters; clients never see it.
    /// </summary>
    internal static string Detail(Exception? exception)
    {
        if (exception is null)
        {
            return "-";
        }

        if (Find<UpstreamHttpClientFactory.ReserveException>(exception) is { } reserve)
        {
            return reserve.Message;
        }

        if (IsOwnFileLimit(exception))
        {
            // .NET reports the process's limit (EMFILE) and the system's (ENFILE) as one error, and
            // its message names the system's ("Too many open files in system"), which misleads.
            var limit = Listeners.OpenFiles.Limit();
            return $"too many open files (Tern's limit, RLIMIT_NOFILE, is {(limit is { } l ? l.ToString(System.Globalization.CultureInfo.InvariantCulture) : "unknown")}; or the system's, fs.file-max)";
        }

        var innermost = exception;
        while (innermost.InnerException is not null)
        {
            innermost = innermost.InnerException;
        }

        var message = innermost.Message.Length > 300 ? innermost.Message[..300] + "..." : innermost.Message;
        return string.Create(message.Length, message, (span, text) =>
        {
            for (var i = 0; i < text.Length; i++)
            {
                span[i] = char.IsControl(text[i]) ? '?' : text[i];
            }
        });
    }

    /// <summary>
    /// Kestrel's refusal of a request body, with its status: a <see cref="BadHttpRequestException"/>,
    /// or the <see cref="IOException"/> wrapping an <see cref="OverflowException"/> that Kestrel's
    /// chunked parser throws for a chunk size of 2^31 or more (a 400, as for any bad chunk size).
    /// </summary>
    internal static (int Status, string Message)? Rejection(Exception? exception)
    {
        if (Find<BadHttpRequestException>(exception) is { } rejected)
        {
            return (rejected.StatusCode, rejected.Message);
        }

        for (var e = exception; e is not null; e = e.InnerException)
        {
            if (e is IOException { InnerException: OverflowException })
            {
                return (StatusCodes.Status400BadRequest, e.Message);
            }
        }

        return null;
    }

    /// <summary>
    /// Whether a forwarding error is Tern's own open-file limit (EMFILE, or the system's ENFILE, which
    /// .NET reports as one error) met while connecting to the upstream, not the upstream's failure.
    /// </summary>
    internal static bool IsOwnFileLimit(Exception? exception) =>
        Find<SocketException>(exception)?.SocketErrorCode == SocketError.TooManyOpenSockets;

    private static T? Find<T>(Exception? exception)
        where T : Exception
    {
        for (var e = exception; e is not null; e = e.InnerException)
        {
            if (e is T match)
            {
                return match;
            }
        }

        return null;
    }

    internal static ILogger Logger(HttpContext context) =>
        context.RequestServices.GetRequiredService<ILoggerFactory>().CreateLogger("Tern.Proxy.Forwarding");
}
