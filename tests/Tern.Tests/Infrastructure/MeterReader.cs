using System.Collections.Concurrent;
using System.Diagnostics.Metrics;
using Tern.Proxy.Tls;

namespace Tern.Tests.Infrastructure;

/// <summary>
/// Reads one meter of one Tern instance, Tern.Tls unless named (MeterListener, filtered to that
/// instance's meter factory, so that other hosts running in parallel do not count). Counters add
/// up their values, observable instruments report their last, histograms count their measurements.
/// </summary>
public sealed class MeterReader : IDisposable
{
    private readonly MeterListener _listener = new();
    private readonly ConcurrentDictionary<string, long> _totals = new();

    public MeterReader(TernInstance tern, string meter = TlsMetrics.MeterName)
    {
        var factory = tern.Services.GetRequiredService<IMeterFactory>();
        _listener.InstrumentPublished = (instrument, listener) =>
        {
            if (instrument.Meter.Name == meter && ReferenceEquals(instrument.Meter.Scope, factory))
            {
                listener.EnableMeasurementEvents(instrument);
            }
        };
        _listener.SetMeasurementEventCallback<long>((instrument, value, tags, _) => Record(instrument, value, tags));
        _listener.SetMeasurementEventCallback<double>((instrument, value, tags, _) => Record(instrument, value, tags));
        _listener.Start();
    }

    private void Record(Instrument instrument, double value, ReadOnlySpan<KeyValuePair<string, object?>> tags)
    {
        var key = Key(instrument, tags);
        if (instrument is Histogram<double> or Histogram<long>)
        {
            _totals.AddOrUpdate(key, 1, (_, count) => count + 1); // how many were recorded
        }
        else if (instrument.IsObservable)
        {
            _totals[key] = (long)value; // an observable counter reports its running total
        }
        else
        {
            _totals.AddOrUpdate(key, (long)value, (_, total) => total + (long)value);
        }
    }

    private static string Key(Instrument instrument, ReadOnlySpan<KeyValuePair<string, object?>> tags) =>
        instrument.Name + string.Concat(tags.ToArray().OrderBy(t => t.Key, StringComparer.Ordinal).Select(t => $"|{t.Key}={t.Value}"));

    /// <summary>Sum of an instrument's measurements (a histogram's: how many) whose tags include every given key=value.</summary>
    public long Total(string instrument, params string[] tags)
    {
        _listener.RecordObservableInstruments();
        return _totals.Where(p => p.Key.Split('|')[0] == instrument && tags.All(t => p.Key.Contains($"|{t}", StringComparison.Ordinal))).Sum(p => p.Value);
    }

    public void Dispose() => _listener.Dispose();
}
