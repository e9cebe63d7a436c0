using System.Diagnostics;
using System.Globalization;
using Microsoft.AspNetCore.Http;
using Microsoft.AspNetCore.Http.Features;
using Microsoft.AspNetCore.Routing;
using OpenTelemetry;
using OpenTelemetry.Trace;
using Tern.Proxy.Forwarding;
using Yarp.ReverseProxy.Forwarder;
using Yarp.ReverseProxy.Model;

namespace Tern.Proxy.Telemetry;

/// <summary>
/// Spans of the requests Tern forwards, pushed over OTLP where OpenTelemetry's standard variables
/// name a collector and OTEL_TRACES_EXPORTER=otlp asks for them (<see cref="Otlp"/>). Two per
/// request: the request as the client sent it (ASP.NET Core's span, with the route, cluster and
/// destination YARP chose), and the upstream call (HttpClient's), whose <c>traceparent</c> the
/// upstream receives in place of the client's. YARP's own span (proxy.forwarder) is not recorded:
/// its tags go on the request's span. Which requests are recorded is OpenTelemetry's sampler,
/// named by OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG (default <c>parentbased_always_on</c>:
/// every request, unless the client's traceparent says its trace is not sampled). With no
/// provider, no span is made and a client's traceparent reaches the upstream unchanged.
/// </summary>
internal sealed class TraceExport : IDisposable
{
    /// <summary>The activity sources recorded: ASP.NET Core's and HttpClient's.</summary>
    public static readonly string[] Sources = ["Microsoft.AspNetCore", "System.Net.Http"];

    public const string SamplerVariable = "OTEL_TRACES_SAMPLER";

    public const string SamplerArgumentVariable = "OTEL_TRACES_SAMPLER_ARG";

    /// <summary>OpenTelemetry's samplers by the names its variable gives them (any case).</summary>
    private static readonly Dictionary<string, Func<double, Sampler>> Samplers = new(StringComparer.OrdinalIgnoreCase)
    {
        ["always_on"] = _ => new AlwaysOnSampler(),
        ["always_off"] = _ => new AlwaysOffSampler(),
        ["traceidratio"] = ratio => new TraceIdRatioBasedSampler(ratio),
        ["parentbased_always_on"] = _ => new ParentBasedSampler(new AlwaysOnSampler()),
        ["parentbased_always_off"] = _ => new ParentBasedSampler(new AlwaysOffSampler()),
        ["parentbased_traceidratio"] = ratio => new ParentBasedSampler(new TraceIdRatioBasedSampler(ratio)),
    };

    private readonly TracerProvider? _provider;

    public TraceExport(OtlpExporterSettings exporterSettings, ILoggerFactory loggers)
    {
        var logger = loggers.CreateLogger(LogFloods.Telemetry);
        if (Otlp.Exports(Otlp.TracesExporterVariable, byDefault: false, served: null, exporterSettings, logger) && ReadSampler(logger) is { } sampler)
        {
            _provider = Sdk.CreateTracerProviderBuilder()
                .AddSource(Sources)
                .SetSampler(new RequestsOnly(sampler))
                .AddOtlpExporter(exporterSettings.Configure)
                .ConfigureResource(Otlp.NameService)
                .Build();
        }
    }

    /// <summary>Whether spans are recorded and pushed.</summary>
    public bool Exporting => _provider is not null;

    /// <summary>
    /// The sampler the variables name, as OpenTelemetry's SDK would read them, or null (with a
    /// warning) where the SDK would not read them as written: it falls back to its default on an
    /// unknown name, and records every request on a ratio it cannot read, each with a line only
    /// on its EventSource; an operator who wrote a ratio to bound the cost would get every
    /// request traced. So Tern exports no traces then, and says why.
    /// </summary>
    private static Sampler? ReadSampler(ILogger logger)
    {
        var name = Otlp.Variable(SamplerVariable);
        if (string.IsNullOrEmpty(name))
        {
            name = "parentbased_always_on";
        }

        if (!Samplers.TryGetValue(name, out var make))
        {
            TernLog.OtlpSettingIgnored(logger, SamplerVariable, name, $"not one of {string.Join(", ", Samplers.Keys)}, so Tern exports no traces");
            return null;
        }

        var ratio = 1.0; // OpenTelemetry's default
        var argument = Otlp.Variable(SamplerArgumentVariable);
        if (name.EndsWith("traceidratio", StringComparison.OrdinalIgnoreCase) && !string.IsNullOrWhiteSpace(argument)
            && !(double.TryParse(argument, NumberStyles.Float, CultureInfo.InvariantCulture, out ratio) && ratio is >= 0 and <= 1))
        {
            TernLog.OtlpSettingIgnored(logger, SamplerArgumentVariable, argument, $"{name} needs the share of traces to record, a number from 0 to 1 (0.01 records 1%), so Tern exports no traces");
            return null;
        }

        return make(ratio);
    }

    /// <summary>
    /// The operator's sampler for the spans of requests; an upstream call outside any request (a
    /// YARP active health probe, every interval of every cluster that has them) is not recorded,
    /// as the management port's probes are not: it would be most of a quiet proxy's traces.
    /// </summary>
    private sealed class RequestsOnly(Sampler inner) : Sampler
    {
        private static readonly SamplingResult Drop = new(SamplingDecision.Drop);

        public override SamplingResult ShouldSample(in SamplingParameters samplingParameters) =>
            samplingParameters.Kind == ActivityKind.Client && samplingParameters.ParentContext.TraceId == default
                ? Drop
                : inner.ShouldSample(samplingParameters);
    }

    /// <summary>
    /// The first step of the pipeline while spans are exported (none otherwise). ASP.NET Core 10's
    /// request span carries no attributes (its switch for them, SuppressActivityOpenTelemetryData,
    /// adds them to every request's span before the sampler has chosen it, 670 B per request
    /// recorded or not), so this writes OpenTelemetry's HTTP server attributes on the spans that
    /// are recorded, when the response is done: method, path, scheme, host and port, protocol,
    /// the connection's peer address, user agent, status code and route; YARP's route, cluster
    /// and destination (its own tag names); for a 5xx, an upstream that failed after its response
    /// began or an exception, the error. It names the span by method and route
    /// ("GET {**catch-all}"), as those conventions name a server span. Requests on the management
    /// port (a kubelet's /healthz every few seconds would be most of a quiet proxy's traces) and
    /// the demo upstream's (not the proxy's) are not recorded.
    /// </summary>
    public static async Task CompleteServerSpanAsync(HttpContext context, RequestDelegate next, int managementPort, int? demoPort)
    {
        var span = context.Features.Get<IHttpActivityFeature>()?.Activity;
        var port = context.Connection.LocalPort;
        if (span is not null && (port == managementPort || port == demoPort))
        {
            span.IsAllDataRequested = false;
            span.ActivityTraceFlags &= ~ActivityTraceFlags.Recorded;
            span = null;
        }

        Exception? thrown = null;
        try
        {
            await next(context).ConfigureAwait(false);
        }
        catch (Exception ex)
        {
            thrown = ex;
            throw;
        }
        finally
        {
            if (span is { IsAllDataRequested: true })
            {
                Complete(span, context, thrown);
            }
        }
    }

    private static void Complete(Activity span, HttpContext context, Exception? thrown)
    {
        var request = context.Request;
        var method = KnownMethod(request.Method);
        span.SetTag("http.request.method", method ?? "_OTHER");
        if (method is null)
        {
            span.SetTag("http.request.method_original", request.Method);
        }

        span.SetTag("url.path", request.PathBase.HasValue ? string.Concat(request.PathBase.Value, request.Path.Value) : request.Path.Value);
        span.SetTag("url.scheme", request.Scheme);
        span.SetTag("server.address", request.Host.Host);
        span.SetTag("server.port", request.Host.Port ?? (request.IsHttps ? 443 : 80)); // the port the client asked for
        span.SetTag("network.protocol.version", HttpProtocol.IsHttp11(request.Protocol) ? "1.1" : HttpProtocol.IsHttp2(request.Protocol) ? "2" : HttpProtocol.IsHttp10(request.Protocol) ? "1.0" : request.Protocol);
        if (context.Connection.RemoteIpAddress is { } peer)
        {
            span.SetTag("network.peer.address", EdgeForwardedHeaders.Plain(peer).ToString()); // the connection's; X-Forwarded-For may name a client behind it
        }

        if (request.Headers.UserAgent is { Count: > 0 } agent)
        {
            span.SetTag("user_agent.original", agent.ToString());
        }

        // An exception the pipeline did not handle becomes Kestrel's 500, after this step.
        var status = thrown is not null && !context.Response.HasStarted ? StatusCodes.Status500InternalServerError : context.Response.StatusCode;
        span.SetTag("http.response.status_code", status);
        var name = method ?? "HTTP";
        if (context.GetEndpoint() is RouteEndpoint { RoutePattern.RawText: { } route })
        {
            span.SetTag("http.route", route);
            name = string.Concat(name, " ", route);
        }

        span.DisplayName = name;
        if (context.Features.Get<IReverseProxyFeature>() is { } proxy)
        {
            span.SetTag("proxy.route_id", proxy.Route.Config.RouteId);
            span.SetTag("proxy.cluster_id", proxy.Cluster?.Config.ClusterId);
            span.SetTag("proxy.destination_id", proxy.ProxiedDestination?.DestinationId);
        }

        // The response's status is the upstream's when the upstream failed after sending it.
        var forwarding = context.Features.Get<IForwarderErrorFeature>()?.Error ?? ForwarderError.None;
        var error = thrown?.GetType().FullName
            ?? (status >= 500 ? status.ToString(CultureInfo.InvariantCulture) : null)
            ?? (forwarding is ForwarderError.ResponseBodyDestination or ForwarderError.UpgradeResponseDestination ? forwarding.ToString() : null);
        if (error is not null)
        {
            span.SetTag("error.type", error);
            span.SetStatus(ActivityStatusCode.Error);
        }
    }

    /// <summary>The method if it is one of HTTP's (their names, which bound a span name's values), else null.</summary>
    private static string? KnownMethod(string method) => method switch
    {
        "GET" or "HEAD" or "POST" or "PUT" or "DELETE" or "CONNECT" or "OPTIONS" or "TRACE" or "PATCH" or "QUERY" => method,
        _ => null,
    };

    public void Dispose() => _provider?.Dispose();
}
