using OpenTelemetry.Resources;

namespace Tern.Proxy.Telemetry;

/// <summary>
/// OpenTelemetry's standard variables that decide what Tern pushes over OTLP: a collector named by
/// <see cref="EndpointVariable"/> gets the metrics unless OTEL_METRICS_EXPORTER says <c>none</c>,
/// and the traces where OTEL_TRACES_EXPORTER says <c>otlp</c>. The exporter reads the rest itself
/// (protocol, headers, timeout, intervals), and the trace provider reads the sampler (see
/// <see cref="TraceExport"/>).
/// </summary>
internal static class Otlp
{
    /// <summary>
    /// The variable that turns the OTLP export on, as OpenTelemetry's SDKs read it (the OpenTelemetry
    /// Operator sets it in a pod it instruments). The exporter reads the rest itself:
    /// OTEL_EXPORTER_OTLP_PROTOCOL (grpc, the default, or http/protobuf), _HEADERS, _TIMEOUT,
    /// OTEL_METRIC_EXPORT_INTERVAL (60 s) and OTEL_BSP_* for spans. (It does not read the
    /// per-signal OTEL_EXPORTER_OTLP_METRICS_ENDPOINT or _TRACES_ENDPOINT.)
    /// </summary>
    public const string EndpointVariable = "OTEL_EXPORTER_OTLP_ENDPOINT";

    public const string MetricsExporterVariable = "OTEL_METRICS_EXPORTER";

    public const string TracesExporterVariable = "OTEL_TRACES_EXPORTER";

    /// <summary>
    /// Whether a signal goes to the collector: the endpoint is set and the signal's exporter
    /// variable says <c>otlp</c>, or is unset where <paramref name="byDefault"/>. OpenTelemetry's
    /// default is <c>otlp</c> for every signal; Tern's for traces is <c>none</c>, because spans cost
    /// a small proxied request 15-40% more CPU (README, Traces) and an operator who points Tern at
    /// a collector for its metrics should not pay that unasked, as nginx and Envoy trace only when
    /// told to. Any other exporter (zipkin, console, a list) is one Tern cannot push: it says so,
    /// and exports nothing of that signal rather than something the operator did not ask for.
    /// </summary>
    public static bool Exports(string exporterVariable, bool byDefault, ILogger logger)
    {
        if (string.IsNullOrEmpty(Environment.GetEnvironmentVariable(EndpointVariable)))
        {
            return false;
        }

        var exporter = Environment.GetEnvironmentVariable(exporterVariable)?.Trim();
        if (string.IsNullOrEmpty(exporter))
        {
            return byDefault;
        }

        if (exporter.Equals("otlp", StringComparison.OrdinalIgnoreCase))
        {
            return true;
        }

        if (!exporter.Equals("none", StringComparison.OrdinalIgnoreCase))
        {
            TernLog.OtlpSettingIgnored(logger, exporterVariable, exporter, "Tern pushes over OTLP only ('otlp' or 'none'), so it exports none of this signal");
        }

        return false;
    }

    /// <summary>The service is "tern", not unknown_service:Tern.Proxy, unless OTEL_SERVICE_NAME names it.</summary>
    public static void NameService(ResourceBuilder resource)
    {
        if (string.IsNullOrEmpty(Environment.GetEnvironmentVariable("OTEL_SERVICE_NAME")))
        {
            resource.AddService("tern");
        }
    }
}
