using System.Diagnostics.Tracing;
using System.Globalization;

namespace Tern.Proxy.Telemetry;

/// <summary>
/// The OTLP exporter's warnings and errors (a collector that cannot be reached, or refuses an
/// export), which it writes only to its EventSource, in Tern's log as event 500: without them an
/// operator whose OTEL_EXPORTER_OTLP_ENDPOINT is wrong sees nothing at all. The exporter tries
/// once per export interval; <see cref="LogFloods"/> writes one such line per minute, and then how
/// many more came.
/// </summary>
internal sealed class OtlpExportLog : EventListener
{
    public const string SourceName = "OpenTelemetry-Exporter-OpenTelemetryProtocol";

    // Set after the base constructor, which may already report sources (and so events) to this one.
    private readonly ILogger? _logger;

    public OtlpExportLog(ILogger logger) => _logger = logger;

    protected override void OnEventSourceCreated(EventSource eventSource)
    {
        if (eventSource.Name == SourceName)
        {
            EnableEvents(eventSource, EventLevel.Warning);
        }
    }

    /// <summary>The message without the exception's inner exceptions and stack: "... Exception: System.Net.Http.HttpRequestException: Connection refused (127.0.0.1:4318)".</summary>
    internal static string FirstLine(string message)
    {
        var end = message.Length;
        foreach (var marker in (string[])["\n", " ---> ", "   at "])
        {
            var at = message.IndexOf(marker, StringComparison.Ordinal);
            if (at >= 0 && at < end)
            {
                end = at;
            }
        }

        return message[..end].TrimEnd();
    }

    protected override void OnEventWritten(EventWrittenEventArgs eventData)
    {
        if (_logger is not { } logger || eventData.EventSource.Name != SourceName)
        {
            return;
        }

        var message = eventData.Message is { } format && eventData.Payload is { } payload
            ? string.Format(CultureInfo.InvariantCulture, format, [.. payload])
            : eventData.EventName ?? "(no message)";
        TernLog.OtlpExportProblem(logger, FirstLine(message));
    }
}
