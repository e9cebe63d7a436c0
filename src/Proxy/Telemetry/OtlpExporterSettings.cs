using OpenTelemetry.Exporter;

namespace Tern.Proxy.Telemetry;

/// <summary>
/// The exporter's settings both signals share, read and checked once, where the exporter would
/// throw on them while it is built and so end Tern at start; each problem is one warning.
/// </summary>
/// <remarks>
/// Made before <see cref="OtlpExportLog"/> listens (MetricsEndpoint takes it), so that the
/// exporter's own lines about values it cannot read come once, from the real exporters.
/// </remarks>
internal sealed class OtlpExporterSettings
{
    public const string HeadersVariable = "OTEL_EXPORTER_OTLP_HEADERS";

    public const string TimeoutVariable = "OTEL_EXPORTER_OTLP_TIMEOUT";

    /// <summary>OpenTelemetry's default for <see cref="TimeoutVariable"/>, in milliseconds.</summary>
    public const int DefaultTimeout = 10_000;

    private readonly bool _timeoutZero;

    public OtlpExporterSettings(ILoggerFactory loggers)
    {
        var logger = loggers.CreateLogger(LogFloods.Telemetry);
        WarnPerSignal(logger);
        if (!Otlp.EndpointSet)
        {
            return;
        }

        var options = new OtlpExporterOptions(); // the OTEL_ variables, read as each exporter reads them

        // The exporter hands 0 to HttpClient, which throws; it reports other values it cannot
        // read itself (event 500) and takes its default.
        _timeoutZero = options.TimeoutMilliseconds == 0;
        Usable = ExporterCanBeMade(options, logger);
        if (_timeoutZero)
        {
            TernLog.OtlpSettingIgnored(logger, TimeoutVariable, "0", $"an export needs some time, so each waits up to {DefaultTimeout} ms (OpenTelemetry's default)");
        }
    }

    /// <summary>
    /// OpenTelemetry's per-signal variables (OTEL_EXPORTER_OTLP_METRICS_ENDPOINT and the like),
    /// which .NET's AddOtlpExporter does not read: set alone, nothing was pushed and nothing said
    /// why; set beside the general one, metrics or traces went where the operator had not pointed
    /// them. One warning each; values are not shown (headers may hold a key).
    /// </summary>
    private static void WarnPerSignal(ILogger logger)
    {
        foreach (var signal in (string[])["METRICS", "TRACES"])
        {
            foreach (var setting in (string[])["ENDPOINT", "HEADERS", "TIMEOUT", "PROTOCOL"])
            {
                var variable = $"OTEL_EXPORTER_OTLP_{signal}_{setting}";
                if (string.IsNullOrEmpty(Otlp.Variable(variable)))
                {
                    continue;
                }

                var consequence = setting != "ENDPOINT" ? ""
                    : Otlp.EndpointSet ? $" (the collector's base address; over http/protobuf Tern adds /v1/{signal.ToLowerInvariant()})"
                    : $", and {Otlp.EndpointVariable} is not set, so nothing is pushed";
                TernLog.OtlpPerSignalIgnored(logger, variable, $"OTEL_EXPORTER_OTLP_{setting}", consequence);
            }
        }
    }

    /// <summary>
    /// Whether an exporter can be made with the OTEL_ settings as they are. Headers it cannot
    /// read would make every export go without them (an API key, a tenant), which the collector
    /// would refuse, so nothing is pushed where it cannot, and the same where it cannot be made at
    /// all (OTEL_EXPORTER_OTLP_CERTIFICATE naming a missing file, say).
    /// </summary>
    public bool Usable { get; } = true;

    /// <summary>What each signal's exporter takes in place of the settings warned of.</summary>
    public void Configure(OtlpExporterOptions options)
    {
        if (_timeoutZero)
        {
            options.TimeoutMilliseconds = DefaultTimeout;
        }
    }

    /// <summary>
    /// Asks the exporter itself: it reads its variables when it is made, the headers URL-decoded,
    /// name=value entries between commas, names trimmed, into a dictionary that also holds its
    /// User-Agent, and throws on an entry without '=' or a name given twice. A name HTTP does
    /// not allow (empty, with a space) passes there and fails every export, so it is checked
    /// after. Nothing is sent; the probe is shut down (its Dispose stops nothing). The headers'
    /// value is never written out: it may hold a key.
    /// </summary>
    private static bool ExporterCanBeMade(OtlpExporterOptions options, ILogger logger)
    {
        options.Endpoint = new Uri("http://127.0.0.1:4318");
        options.TimeoutMilliseconds = DefaultTimeout;
        try
        {
            var probe = new OtlpTraceExporter(options);
            probe.Shutdown(0);
            probe.Dispose();
        }
        catch (ArgumentException)
        {
            TernLog.OtlpHeadersIgnored(logger, HeadersVariable);
            return false;
        }
#pragma warning disable CA1031 // whatever the exporter throws on its settings must not end Tern
        catch (Exception ex)
#pragma warning restore CA1031
        {
            TernLog.OtlpExporterNotMade(logger, OtlpExportLog.FirstLine(ex.Message));
            return false;
        }

        using var request = new HttpRequestMessage();
        var names = Uri.UnescapeDataString(Otlp.Variable(HeadersVariable) ?? "").Split(',', StringSplitOptions.RemoveEmptyEntries)
            .Select(entry => entry.Split('=', 2)[0].Trim());
        if (names.Any(name => !request.Headers.TryAddWithoutValidation(name, "")))
        {
            TernLog.OtlpHeadersIgnored(logger, HeadersVariable);
            return false;
        }

        return true;
    }
}
