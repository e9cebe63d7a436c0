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
        if (!Otlp.EndpointSet)
        {
            return;
        }

        var logger = loggers.CreateLogger(LogFloods.Telemetry);
        HeadersRead = ExporterReadsHeaders();
        if (!HeadersRead)
        {
            TernLog.OtlpHeadersIgnored(logger, HeadersVariable);
        }

        // The exporter hands 0 to HttpClient, which throws; it reports other values it cannot
        // read itself (event 500) and takes its default. Read as it reads the variable.
        _timeoutZero = new OtlpExporterOptions().TimeoutMilliseconds == 0;
        if (_timeoutZero)
        {
            TernLog.OtlpSettingIgnored(logger, TimeoutVariable, "0", $"an export needs some time, so each waits up to {DefaultTimeout} ms (OpenTelemetry's default)");
        }
    }

    /// <summary>
    /// Whether the exporter can read <see cref="HeadersVariable"/>. A collector that needs those
    /// headers (an API key, a tenant) would refuse what came without them, so nothing is pushed
    /// where it cannot. The value is never written out: it may hold a key.
    /// </summary>
    public bool HeadersRead { get; } = true;

    /// <summary>What each signal's exporter takes in place of the settings warned of.</summary>
    public void Configure(OtlpExporterOptions options)
    {
        if (_timeoutZero)
        {
            options.TimeoutMilliseconds = DefaultTimeout;
        }
    }

    /// <summary>
    /// Asks the exporter itself: it reads the variable when it is made (URL-decoded, name=value
    /// entries between commas, names trimmed, into a dictionary that also holds its User-Agent)
    /// and throws on an entry without '=' or a name given twice. Nothing is sent.
    /// </summary>
    private static bool ExporterReadsHeaders()
    {
        try
        {
            using var probe = new OtlpTraceExporter(new OtlpExporterOptions { Endpoint = new Uri("http://127.0.0.1:4318"), TimeoutMilliseconds = DefaultTimeout });
            return true;
        }
        catch (ArgumentException)
        {
            return false;
        }
    }
}
