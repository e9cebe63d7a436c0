using System.Collections.Concurrent;
using System.Diagnostics.Metrics;
using Tern.Proxy.Tls;

namespace Tern.Tests.Infrastructure;

/// <summary>
/// Reads one Tern instance's Tern.Tls meter (MeterListener, filtered to that instance's meter
/// factory, so that other hosts running in parallel do not count).
/// </summary>
public sealed class TlsMeterReader : IDisposable
{
    private readonly MeterListener _listener = new();
    private readonly ConcurrentDictionary<string, long> _totals = new();

    public TlsMeterReader(TernInstance tern)
    {
        var factory = tern.Services.GetRequiredService<IMeterFactory>();
        _listener.InstrumentPublished = (instrument, listener) =>
        {
            if (instrument.Meter.Name == TlsMetrics.MeterName && ReferenceEquals(instrument.Meter.Scope, factory))
            {
                listener.EnableMeasurementEvents(instrument);
            }
        };
        _listener.SetMeasurementEventCallback<long>((instrument, value, tags, _) =>
        {
            var key = instrument.Name + string.Concat(tags.ToArray().OrderBy(t => t.Key, StringComparer.Ordinal).Select(t => $"|{t.Key}={t.Value}"));
            if (instrument.IsObservable)
            {
                _totals[key] = value; // an observable counter reports its running total
            }
            else
            {
                _totals.AddOrUpdate(key, value, (_, total) => total + value);
            }
        });
        _listener.Start();
    }

    /// <summary>Sum of an instrument's measurements whose tags include every given key=value.</summary>
    public long Total(string instrument, params string[] tags)
    {
        _listener.RecordObservableInstruments();
        return _totals.Where(p => p.Key.Split('|')[0] == instrument && tags.All(t => p.Key.Contains($"|{t}", StringComparison.Ordinal))).Sum(p => p.Value);
    }

    public void Dispose() => _listener.Dispose();
}
