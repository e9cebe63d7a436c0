using OpenTelemetry.Exporter;
using OpenTelemetry.Resources;

namespace Tern.Proxy.Telemetry;

/// <summary>
/// OpenTelemetry's standard variables that decide what Tern pushes over OTLP: a collector named by
/// <see cref="EndpointVariable"/> gets the metrics unless OTEL_METRICS_EXPORTER leaves out
/// <c>otlp</c>, and the traces where OTEL_TRACES_EXPORTER names it. The exporter reads the rest
/// itself (protocol, headers, timeout, intervals); <see cref="TraceExport"/> reads the sampler.
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

    /// <summary>Whether <see cref="EndpointVariable"/> names a collector.</summary>
    public static bool EndpointSet => !string.IsNullOrEmpty(Environment.GetEnvironmentVariable(EndpointVariable));

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
    /// endpoint): each is one warning naming the variable.
    /// </summary>
    public static bool Exports(string exporterVariable, bool byDefault, string? served, ILogger logger)
    {
        var endpointSet = EndpointSet;
        var headersRead = HeadersProblem() is null; // else nothing is pushed (CheckExporterSettings says why)
        var value = Environment.GetEnvironmentVariable(exporterVariable);
        if (string.IsNullOrWhiteSpace(value))
        {
            return endpointSet && byDefault && headersRead;
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

        return otlp && endpointSet && headersRead;
    }

    public const string HeadersVariable = "OTEL_EXPORTER_OTLP_HEADERS";

    /// <summary>
    /// What in <see cref="HeadersVariable"/> the exporter cannot read, or null: it takes the value
    /// URL-decoded, then name=value entries between commas, and throws while it is built on an
    /// entry without '=' or without a name (a trailing comma, say), which ended Tern at start. A
    /// collector that needs those headers (an API key, a tenant) would refuse what came without
    /// them, so nothing is pushed then. The value is never written out: it may hold a key.
    /// </summary>
    public static string? HeadersProblem()
    {
        var value = Environment.GetEnvironmentVariable(HeadersVariable);
        if (string.IsNullOrEmpty(value))
        {
            return null;
        }

        var entries = Uri.UnescapeDataString(value).Split(',');
        for (var i = 0; i < entries.Length; i++)
        {
            var equals = entries[i].IndexOf('=', StringComparison.Ordinal);
            if (equals < 0 || entries[i].AsSpan(0, equals).Trim().IsEmpty)
            {
                var what = entries[i].Trim().Length == 0 ? "is empty" : equals < 0 ? "has no '='" : "has no name before its '='";
                return $"its entry {i + 1} of {entries.Length} {what}; write name=value entries separated by commas";
            }
        }

        return null;
    }

    public const string TimeoutVariable = "OTEL_EXPORTER_OTLP_TIMEOUT";

    /// <summary>OpenTelemetry's default for <see cref="TimeoutVariable"/>, in milliseconds.</summary>
    public const int DefaultTimeout = 10_000;

    /// <summary>
    /// Whether <see cref="TimeoutVariable"/> is 0, which the exporter hands to HttpClient, which
    /// throws, ending Tern at start (the exporter reports other values it cannot read itself,
    /// event 500, and takes its default).
    /// </summary>
    private static bool TimeoutZero =>
        int.TryParse(Environment.GetEnvironmentVariable(TimeoutVariable), System.Globalization.NumberStyles.None, System.Globalization.CultureInfo.InvariantCulture, out var ms) && ms == 0;

    /// <summary>Warns, once for both signals, of the exporter's settings Tern does not use as written (<see cref="HeadersProblem"/>, <see cref="TimeoutZero"/>).</summary>
    public static void CheckExporterSettings(ILogger logger)
    {
        if (HeadersProblem() is { } problem)
        {
            TernLog.OtlpHeadersIgnored(logger, HeadersVariable, problem);
        }

        if (TimeoutZero)
        {
            TernLog.OtlpSettingIgnored(logger, TimeoutVariable, Environment.GetEnvironmentVariable(TimeoutVariable)!, $"an export needs some time, so each waits up to {DefaultTimeout} ms (OpenTelemetry's default)");
        }
    }

    /// <summary>What each signal's exporter takes in place of the settings <see cref="CheckExporterSettings"/> warns of.</summary>
    public static void ConfigureExporter(OtlpExporterOptions options)
    {
        if (TimeoutZero)
        {
            options.TimeoutMilliseconds = DefaultTimeout;
        }
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
        var value = Environment.GetEnvironmentVariable(MetricIntervalVariable);
        if (string.IsNullOrEmpty(value) || (int.TryParse(value, System.Globalization.NumberStyles.None, System.Globalization.CultureInfo.InvariantCulture, out var ms) && ms > 0))
        {
            return null;
        }

        TernLog.OtlpSettingIgnored(logger, MetricIntervalVariable, value, $"not a whole number of milliseconds above 0, so the metrics are pushed every {DefaultMetricInterval} ms (OpenTelemetry's default)");
        return DefaultMetricInterval;
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
