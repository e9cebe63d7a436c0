using System.Globalization;
using Microsoft.Extensions.Configuration;
using OpenTelemetry.Resources;

namespace Tern.Proxy.Telemetry;

/// <summary>
/// OpenTelemetry's standard variables that decide what Tern pushes over OTLP: a collector named by
/// <see cref="EndpointVariable"/> gets the metrics unless OTEL_METRICS_EXPORTER leaves out
/// <c>otlp</c>, and the traces where OTEL_TRACES_EXPORTER names it. The exporter reads the rest
/// itself (protocol, headers, timeout, intervals), where Tern has checked first what it would
/// throw on (<see cref="OtlpExporterSettings"/>, <see cref="MetricInterval"/>);
/// <see cref="TraceExport"/> reads the sampler.
/// </summary>
internal static class Otlp
{
    /// <summary>
    /// The variable that turns the OTLP export on, as OpenTelemetry's SDKs read it (the OpenTelemetry
    /// Operator sets it in a pod it instruments). The exporter reads the rest itself:
    /// OTEL_EXPORTER_OTLP_PROTOCOL (grpc, the default, or http/protobuf), _HEADERS, _TIMEOUT,
    /// OTEL_METRIC_EXPORT_INTERVAL (60 s) and OTEL_BSP_* for spans. (AddOtlpExporter, which Tern
    /// uses, does not read the per-signal OTEL_EXPORTER_OTLP_METRICS_* or _TRACES_* variables:
    /// ENDPOINT, HEADERS, TIMEOUT, PROTOCOL; OtlpExporterSettings warns of each.)
    /// </summary>
    public const string EndpointVariable = "OTEL_EXPORTER_OTLP_ENDPOINT";

    /// <summary>
    /// An OpenTelemetry variable as the SDK reads it, through .NET's configuration, which takes
    /// its name in any case (otel_exporter_otlp_endpoint too, the last one listed where two
    /// differ in case); null where it is not set. Read at start only.
    /// </summary>
    public static string? Variable(string name) => new ConfigurationBuilder().AddEnvironmentVariables().Build()[name];

    /// <summary>Whether <see cref="EndpointVariable"/> names a collector.</summary>
    public static bool EndpointSet => !string.IsNullOrEmpty(Variable(EndpointVariable));

    public const string MetricsExporterVariable = "OTEL_METRICS_EXPORTER";

    public const string TracesExporterVariable = "OTEL_TRACES_EXPORTER";

    /// <summary>
    /// Whether a signal goes to the collector: the endpoint is set and the signal's exporter
    /// variable (a comma-separated list) names <c>otlp</c>, or is unset where
    /// <paramref name="byDefault"/>. OpenTelemetry's default is <c>otlp</c> for every signal;
    /// Tern's for traces is <c>none</c>, because spans cost a small proxied request 20% (1%
    /// sampled) to 31% (all) more CPU (README, Traces), and an operator who points Tern at a
    /// collector for its metrics should not pay that unasked, as nginx and Envoy trace only when
    /// told to. <c>none</c>, and <paramref name="served"/> (<c>prometheus</c> for the metrics,
    /// which /metrics serves anyway), are taken as they are. Any other exporter (zipkin, console) is one Tern cannot
    /// push, and <c>otlp</c> without the endpoint one it cannot reach (it reads no per-signal
    /// endpoint): each is one warning naming the variable. Settings the exporter cannot be made
    /// with (headers it cannot read, say) push nothing (<see cref="OtlpExporterSettings"/>).
    /// </summary>
    public static bool Exports(string exporterVariable, bool byDefault, string? served, OtlpExporterSettings exporter, ILogger logger)
    {
        var endpointSet = EndpointSet;
        var usable = exporter.Usable; // else nothing is pushed (OtlpExporterSettings says why)
        var value = Variable(exporterVariable);
        if (string.IsNullOrWhiteSpace(value))
        {
            return endpointSet && byDefault && usable;
        }

        var names = value.Split(',', StringSplitOptions.TrimEntries | StringSplitOptions.RemoveEmptyEntries);
        var unknown = names.Where(n => !n.Equals("otlp", StringComparison.OrdinalIgnoreCase) && !n.Equals("none", StringComparison.OrdinalIgnoreCase)
            && !n.Equals(served, StringComparison.OrdinalIgnoreCase)).ToList();
        if (unknown.Count > 0)
        {
            TernLog.OtlpSettingIgnored(logger, exporterVariable, value, $"Tern pushes over OTLP only ('otlp'), so {string.Join(", ", unknown)} exports nothing");
        }

        var otlp = names.Any(n => n.Equals("otlp", StringComparison.OrdinalIgnoreCase));
        if (otlp && !endpointSet)
        {
            TernLog.OtlpSettingIgnored(logger, exporterVariable, value, $"{EndpointVariable} is not set (Tern reads no per-signal endpoint), so nothing is pushed");
        }

        return otlp && endpointSet && usable;
    }

    public const string MetricIntervalVariable = "OTEL_METRIC_EXPORT_INTERVAL";

    /// <summary>OpenTelemetry's default for <see cref="MetricIntervalVariable"/>, in milliseconds.</summary>
    public const int DefaultMetricInterval = 60_000;

    /// <summary>
    /// The metrics' push interval to use in place of <see cref="MetricIntervalVariable"/>'s value,
    /// with a warning, where that value is not a whole number of milliseconds above 0 (the SDK
    /// threw on 0 and ended Tern at start, never pushed on -1, and took its default without a word
    /// on anything else); null where it is one, or unset.
    /// </summary>
    public static int? MetricInterval(ILogger logger)
    {
        var value = Variable(MetricIntervalVariable);
        if (string.IsNullOrEmpty(value) || (int.TryParse(value, NumberStyles.None, CultureInfo.InvariantCulture, out var ms) && ms > 0))
        {
            return null;
        }

        TernLog.OtlpSettingIgnored(logger, MetricIntervalVariable, value, $"not a whole number of milliseconds above 0, so the metrics are pushed every {DefaultMetricInterval} ms (OpenTelemetry's default)");
        return DefaultMetricInterval;
    }

    /// <summary>The service is "tern", not unknown_service:Tern.Proxy, unless OTEL_SERVICE_NAME names it.</summary>
    public static void NameService(ResourceBuilder resource)
    {
        if (string.IsNullOrEmpty(Variable("OTEL_SERVICE_NAME")))
        {
            resource.AddService("tern");
        }
    }
}
