using System.Diagnostics;
using System.Globalization;
using Microsoft.AspNetCore.Http;
using Microsoft.AspNetCore.Http.Features;
using Microsoft.AspNetCore.Routing;
using OpenTelemetry;
using OpenTelemetry.Trace;
using Yarp.ReverseProxy.Model;

namespace Tern.Proxy.Telemetry;

/// <summary>
/// Spans of the requests Tern forwards, pushed over OTLP where OpenTelemetry's standard variables
/// name a collector and OTEL_TRACES_EXPORTER=otlp asks for them (<see cref="Otlp"/>). Two per
/// request: the request as the client sent it (ASP.NET Core's span, with the route, cluster and
/// destination YARP chose), and the upstream call (HttpClient's), whose <c>traceparent</c> the
/// upstream receives in place of the client's. YARP's own span (proxy.forwarder) is not recorded:
/// its tags go on the request's span. Which requests are recorded is OpenTelemetry's sampler,
/// read from OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG by the SDK (default
/// <c>parentbased_always_on</c>: every request, unless the client's traceparent says its trace is
/// not sampled). With no provider, no span is made and a client's traceparent reaches the
/// upstream unchanged.
/// </summary>
internal sealed class TraceExport : IDisposable
{
    /// <summary>The activity sources recorded: ASP.NET Core's and HttpClient's.</summary>
    public static readonly string[] Sources = ["Microsoft.AspNetCore", "System.Net.Http"];

    public const string SamplerVariable = "OTEL_TRACES_SAMPLER";

    public const string SamplerArgumentVariable = "OTEL_TRACES_SAMPLER_ARG";

    /// <summary>The samplers OpenTelemetry's SDK reads from <see cref="SamplerVariable"/> (any case).</summary>
    private static readonly string[] Samplers =
        ["always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off", "parentbased_traceidratio"];

    private readonly TracerProvider? _provider;

    public TraceExport(ILoggerFactory loggers)
    {
        var logger = loggers.CreateLogger(LogFloods.Telemetry);
        if (Otlp.Exports(Otlp.TracesExporterVariable, byDefault: false, logger) && SamplerUsable(logger))
        {
            _provider = Sdk.CreateTracerProviderBuilder()
                .AddSource(Sources)
                .AddOtlpExporter()
                .ConfigureResource(Otlp.NameService)
                .Build();
        }
    }

    /// <summary>Whether spans are recorded and pushed.</summary>
    public bool Exporting => _provider is not null;

    /// <summary>
    /// Whether the sampler variables are ones the SDK reads as written. It falls back to its
    /// default on an unknown sampler and samples everything on a ratio it cannot read, each with
    /// a line only on its EventSource; an operator who wrote a ratio to bound the cost would get
    /// every request traced. So Tern exports no traces then, and says why.
    /// </summary>
    private static bool SamplerUsable(ILogger logger)
    {
        var sampler = Environment.GetEnvironmentVariable(SamplerVariable)?.Trim();
        if (string.IsNullOrEmpty(sampler))
        {
            return true;
        }

        if (!Samplers.Contains(sampler, StringComparer.OrdinalIgnoreCase))
        {
            TernLog.OtlpSettingIgnored(logger, SamplerVariable, sampler, $"not one of {string.Join(", ", Samplers)}, so Tern exports no traces");
            return false;
        }

        var argument = Environment.GetEnvironmentVariable(SamplerArgumentVariable)?.Trim();
        if (sampler.EndsWith("traceidratio", StringComparison.OrdinalIgnoreCase) && !string.IsNullOrEmpty(argument)
            && !(double.TryParse(argument, NumberStyles.Float, CultureInfo.InvariantCulture, out var ratio) && ratio is >= 0 and <= 1))
        {
            TernLog.OtlpSettingIgnored(logger, SamplerArgumentVariable, argument, $"{sampler} needs the share of traces to record, a number from 0 to 1 (0.01 records 1%), so Tern exports no traces");
            return false;
        }

        return true;
    }

    /// <summary>
    /// The first step of the pipeline while spans are exported (none otherwise). ASP.NET Core 10's
    /// request span carries no attributes (its switch for them, SuppressActivityOpenTelemetryData,
    /// adds them to every request's span before the sampler has chosen it, 670 B per request
    /// recorded or not), so this writes OpenTelemetry's HTTP server attributes on the spans that
    /// are recorded, when the response is done: method, path, scheme, host and port, protocol,
    /// the connection's peer address, user agent, status code and route; YARP's route, cluster
    /// and destination (its own tag names); for a 5xx, the error. It names the span by method
    /// and route ("GET /{**catch-all}"), as those conventions name a server span. Probes and
    /// scrapes on the management port are not recorded: a kubelet's /healthz every few seconds
    /// would be most of a quiet proxy's traces.
    /// </summary>
    public static async Task CompleteServerSpanAsync(HttpContext context, RequestDelegate next, int managementPort)
    {
        var span = context.Features.Get<IHttpActivityFeature>()?.Activity;
        if (span is not null && context.Connection.LocalPort == managementPort)
        {
            span.IsAllDataRequested = false;
            span.ActivityTraceFlags &= ~ActivityTraceFlags.Recorded;
            span = null;
        }

        try
        {
            await next(context).ConfigureAwait(false);
        }
        finally
        {
            if (span is { IsAllDataRequested: true })
            {
                Complete(span, context);
            }
        }
    }

    private static void Complete(Activity span, HttpContext context)
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
        span.SetTag("server.port", request.Host.Port ?? context.Connection.LocalPort);
        span.SetTag("network.protocol.version", request.Protocol switch { "HTTP/1.1" => "1.1", "HTTP/2" => "2", "HTTP/1.0" => "1.0", var other => other });
        if (context.Connection.RemoteIpAddress is { } peer)
        {
            span.SetTag("network.peer.address", (peer.IsIPv4MappedToIPv6 ? peer.MapToIPv4() : peer).ToString()); // the connection's; X-Forwarded-For may name a client behind it
        }

        if (request.Headers.UserAgent is { Count: > 0 } agent)
        {
            span.SetTag("user_agent.original", agent.ToString());
        }

        var status = context.Response.StatusCode;
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

        if (status >= 500)
        {
            span.SetTag("error.type", status.ToString(CultureInfo.InvariantCulture));
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
