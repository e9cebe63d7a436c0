using Microsoft.AspNetCore.Http;
using OpenTelemetry;
using OpenTelemetry.Metrics;
using OpenTelemetry.Resources;
using Tern.Proxy.Configuration;
using Tern.Proxy.Tls;

namespace Tern.Proxy.Telemetry;

/// <summary>
/// Tern's meters and the platform's, collected by OpenTelemetry and served for Prometheus at
/// /metrics on the management port; also pushed over OTLP where OpenTelemetry's standard
/// variables name a collector (<see cref="Otlp"/>).
/// </summary>
internal sealed class MetricsEndpoint : IDisposable
{
    /// <summary>Meters exported: Tern's own, Kestrel's, ASP.NET Core hosting's, HttpClient's (upstream calls) and the runtime's.</summary>
    public static readonly string[] Meters =
    [
        TlsMetrics.MeterName,
        Listeners.SocketTransport.MeterName,
        "Microsoft.AspNetCore.Server.Kestrel",
        "Microsoft.AspNetCore.Hosting",
        "System.Net.Http",
        "System.Runtime",
    ];

    /// <summary>
    /// Instruments the platform updates on every request to track what is in flight: each update
    /// is a tag lookup in OpenTelemetry, and together (eight updates and one histogram per
    /// request) they cost about 14% of the CPU of a small proxied request. Exported only with
    /// Tern:Metrics:InFlight. The request duration histograms stay: their count is the request
    /// rate, and the rate of their sum is the mean number of requests in flight.
    /// </summary>
    public static readonly string[] InFlightInstruments =
    [
        "http.server.active_requests",
        "http.client.active_requests",
        "http.client.open_connections",
        "http.client.request.time_in_queue",
    ];

    private readonly PrometheusTextExporter _exporter = new();
    private readonly BaseExportingMetricReader _reader;
    private readonly MeterProvider _provider;
    private readonly Lock _scrape = new();
    private readonly OtlpExportLog? _otlpLog;

    public MetricsEndpoint(ActiveConfiguration active, OtlpExporterSettings exporterSettings, ILoggerFactory loggers)
    {
        var logger = loggers.CreateLogger(LogFloods.Telemetry);
        _reader = new BaseExportingMetricReader(_exporter);
        var builder = Sdk.CreateMeterProviderBuilder().AddMeter(Meters).AddReader(_reader);
        if (!active.Bound.MetricsInFlight)
        {
            // A dropped instrument is never enabled, so the platform skips the update itself.
            foreach (var name in InFlightInstruments)
            {
                builder.AddView(name, MetricStreamConfiguration.Drop);
            }
        }

        if (Otlp.EndpointSet)
        {
            // The exporter's problems, with metrics or traces, are logged whatever is exported.
            _otlpLog = new OtlpExportLog(logger);
        }

        // Every instrument is then recorded for both readers: measured, see README (Metrics).
        if (Otlp.Exports(Otlp.MetricsExporterVariable, byDefault: true, served: "prometheus", exporterSettings, logger))
        {
            var interval = Otlp.MetricInterval(logger);
            builder.AddOtlpExporter((exporter, reader) =>
            {
                exporterSettings.Configure(exporter);
                if (interval is { } ms)
                {
                    reader.PeriodicExportingMetricReaderOptions.ExportIntervalMilliseconds = ms;
                }
            }).ConfigureResource(Otlp.NameService);
        }

        _provider = builder.Build();
    }

    public Task WriteAsync(HttpContext context)
    {
        string text;
        lock (_scrape)
        {
            text = _exporter.Collect?.Invoke(5000) == true ? _exporter.Text : string.Empty;
        }

        context.Response.ContentType = "text/plain; version=0.0.4; charset=utf-8";
        return context.Response.WriteAsync(text);
    }

    public void Dispose()
    {
        _provider.Dispose();
        _otlpLog?.Dispose();
    }
}
