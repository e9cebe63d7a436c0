using Microsoft.AspNetCore.Http;
using OpenTelemetry;
using OpenTelemetry.Metrics;
using Tern.Proxy.Tls;

namespace Tern.Proxy.Telemetry;

/// <summary>
/// Tern's meters and the platform's, collected by OpenTelemetry and served for Prometheus at
/// /metrics on the management port.
/// </summary>
internal sealed class MetricsEndpoint : IDisposable
{
    /// <summary>Meters exported: Tern's own, Kestrel's, ASP.NET Core hosting's, HttpClient's (upstream calls) and the runtime's.</summary>
    public static readonly string[] Meters =
    [
        TlsMetrics.MeterName,
        "Microsoft.AspNetCore.Server.Kestrel",
        "Microsoft.AspNetCore.Hosting",
        "System.Net.Http",
        "System.Runtime",
    ];

    private readonly PrometheusTextExporter _exporter = new();
    private readonly BaseExportingMetricReader _reader;
    private readonly MeterProvider _provider;
    private readonly Lock _scrape = new();

    public MetricsEndpoint()
    {
        _reader = new BaseExportingMetricReader(_exporter);
        _provider = Sdk.CreateMeterProviderBuilder().AddMeter(Meters).AddReader(_reader).Build();
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

    public void Dispose() => _provider.Dispose();
}
