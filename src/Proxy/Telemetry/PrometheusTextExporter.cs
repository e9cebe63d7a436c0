using System.Globalization;
using System.Text;
using OpenTelemetry;
using OpenTelemetry.Metrics;

namespace Tern.Proxy.Telemetry;

/// <summary>
/// Renders OpenTelemetry metrics in Prometheus' text format (0.0.4) when scraped. Written here
/// because the OpenTelemetry Prometheus exporter packages are not served by our registry; it
/// covers what Tern's meters use: counters, up-down counters, gauges and histograms.
/// </summary>
[ExportModes(ExportModes.Pull)]
internal sealed class PrometheusTextExporter : BaseExporter<Metric>, IPullMetricExporter
{
    private string _text = string.Empty;

    /// <summary>Set by the reader: collects now (within OpenTelemetry's pull scope) and calls Export.</summary>
    public Func<int, bool>? Collect { get; set; }

    /// <summary>The text of the last collection.</summary>
    public string Text => _text;

    public override ExportResult Export(in Batch<Metric> batch)
    {
        var text = new StringBuilder(16 * 1024);
        foreach (var metric in batch)
        {
            Write(text, metric);
        }

        _text = text.ToString();
        return ExportResult.Success;
    }

    private static void Write(StringBuilder text, Metric metric)
    {
        var monotonic = metric.MetricType is MetricType.LongSum or MetricType.DoubleSum;
        var histogram = metric.MetricType == MetricType.Histogram;
        var name = Name(metric.Name, metric.Unit, monotonic);
        var type = monotonic ? "counter" : histogram ? "histogram" : "gauge";
        if (!string.IsNullOrEmpty(metric.Description))
        {
            text.Append("# HELP ").Append(name).Append(' ').Append(metric.Description.Replace("\\", "\\\\", StringComparison.Ordinal).Replace("\n", "\\n", StringComparison.Ordinal)).Append('\n');
        }

        text.Append("# TYPE ").Append(name).Append(' ').Append(type).Append('\n');
        foreach (ref readonly var point in metric.GetMetricPoints())
        {
            var labels = Labels(point.Tags);
            if (histogram)
            {
                long cumulative = 0;
                foreach (var bucket in point.GetHistogramBuckets())
                {
                    cumulative += bucket.BucketCount;
                    var bound = double.IsPositiveInfinity(bucket.ExplicitBound) ? "+Inf" : Number(bucket.ExplicitBound);
                    Sample(text, name + "_bucket", WithLabel(labels, "le", bound), cumulative.ToString(CultureInfo.InvariantCulture));
                }

                Sample(text, name + "_sum", labels, Number(point.GetHistogramSum()));
                Sample(text, name + "_count", labels, point.GetHistogramCount().ToString(CultureInfo.InvariantCulture));
                continue;
            }

            var value = metric.MetricType switch
            {
                MetricType.LongSum or MetricType.LongSumNonMonotonic => point.GetSumLong().ToString(CultureInfo.InvariantCulture),
                MetricType.DoubleSum or MetricType.DoubleSumNonMonotonic => Number(point.GetSumDouble()),
                MetricType.LongGauge => point.GetGaugeLastValueLong().ToString(CultureInfo.InvariantCulture),
                MetricType.DoubleGauge => Number(point.GetGaugeLastValueDouble()),
                _ => null,
            };
            if (value is not null)
            {
                Sample(text, name, labels, value);
            }
        }
    }

    /// <summary>OpenTelemetry name and unit → Prometheus name (tern.tls.bytes, By → tern_tls_bytes_total).</summary>
    internal static string Name(string name, string? unit, bool monotonic)
    {
        var result = Sanitize(name);
        var suffix = unit switch
        {
            "By" => "bytes",
            "s" => "seconds",
            "ms" => "milliseconds",
            "1" or null or "" => null,
            _ when unit.StartsWith('{') => null, // annotations such as {connection} carry no unit
            _ => Sanitize(unit),
        };
        if (suffix is not null && !result.EndsWith("_" + suffix, StringComparison.Ordinal))
        {
            result += "_" + suffix;
        }

        return monotonic && !result.EndsWith("_total", StringComparison.Ordinal) ? result + "_total" : result;
    }

    private static string Sanitize(string name)
    {
        var result = new StringBuilder(name.Length);
        foreach (var c in name)
        {
            result.Append(char.IsAsciiLetterOrDigit(c) || c == '_' ? c : '_');
        }

        if (result.Length > 0 && char.IsAsciiDigit(result[0]))
        {
            result.Insert(0, '_');
        }

        return result.ToString();
    }

    private static List<(string Key, string Value)> Labels(ReadOnlyTagCollection tags)
    {
        var labels = new List<(string, string)>();
        foreach (var tag in tags)
        {
            var value = tag.Value switch
            {
                bool b => b ? "true" : "false",
                IFormattable f => f.ToString(null, CultureInfo.InvariantCulture),
                var other => other?.ToString() ?? string.Empty,
            };
            labels.Add((Sanitize(tag.Key), value));
        }

        return labels;
    }

    private static List<(string Key, string Value)> WithLabel(List<(string Key, string Value)> labels, string key, string value) => [.. labels, (key, value)];

    private static void Sample(StringBuilder text, string name, List<(string Key, string Value)> labels, string value)
    {
        text.Append(name);
        if (labels.Count > 0)
        {
            text.Append('{');
            for (var i = 0; i < labels.Count; i++)
            {
                if (i > 0)
                {
                    text.Append(',');
                }

                text.Append(labels[i].Key).Append("=\"")
                    .Append(labels[i].Value.Replace("\\", "\\\\", StringComparison.Ordinal).Replace("\"", "\\\"", StringComparison.Ordinal).Replace("\n", "\\n", StringComparison.Ordinal))
                    .Append('"');
            }

            text.Append('}');
        }

        text.Append(' ').Append(value).Append('\n');
    }

    private static string Number(double value) =>
        double.IsPositiveInfinity(value) ? "+Inf" : double.IsNegativeInfinity(value) ? "-Inf" : double.IsNaN(value) ? "NaN" : value.ToString("R", CultureInfo.InvariantCulture);
}
