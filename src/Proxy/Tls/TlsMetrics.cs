using System.Diagnostics;
using System.Diagnostics.Metrics;
using Tern.Proxy.Configuration;

namespace Tern.Proxy.Tls;

/// <summary>
/// The Tern.Tls meter: where payload bytes went (straight into pipe memory, or through the spill
/// buffer), handshakes and their duration, open TLS connections. "Zero copies in steady state" is
/// a claim these counters prove under load. Tag names follow OpenTelemetry's conventions. With
/// every engine: when each certificate served expires.
/// </summary>
public sealed class TlsMetrics : IDisposable
{
    public const string MeterName = "Tern.Tls";

    /// <summary>error.type of a handshake that failed because the client certificate was missing or untrusted.</summary>
    public const string ClientCertificateRefused = "client_certificate";

    /// <summary>Values of tern.tls.path.</summary>
    public static class Paths
    {
        /// <summary>Written by OpenSSL straight into the pipe memory Kestrel (or the socket) reads.</summary>
        public const string Direct = "direct";

        /// <summary>Went through the per-connection spill buffer: one extra copy.</summary>
        public const string Spill = "spill";

        // No "carry" or "copy": Tern has no code that carries ciphertext over between reads or
        // copies payload in managed code, so those paths are never reported (the load test and the
        // tests read their absence as zero).
    }

    /// <summary>Values of tern.tls.direction for bytes.</summary>
    public enum Direction
    {
        /// <summary>Plaintext out of a decryption.</summary>
        Decrypt,

        /// <summary>Ciphertext out of an encryption.</summary>
        Encrypt,

        /// <summary>Handshake records.</summary>
        Handshake,

        /// <summary>close_notify.</summary>
        Shutdown,
    }

    private static readonly string[] s_directions = ["decrypt", "encrypt", "handshake", "shutdown"];

    // tern.tls.bytes is counted on every read and every write of every connection, so it is not a
    // Counter: each Counter.Add with tags is a tag lookup in OpenTelemetry (0.3-0.4 µs per HTTP/1.1
    // 1 KB request for the two, perf). The pumps add to these totals instead (one Interlocked.Add),
    // and an ObservableCounter reports them when metrics are collected. Index: direction * 2 + path
    // (0 direct, 1 spill).
    private readonly long[] _byteTotals = new long[s_directions.Length * 2];
    private readonly KeyValuePair<string, object?>[][] _byteTags;

    private readonly Meter _meter;
    private readonly Counter<long> _spillEvents;
    private readonly Counter<long> _handshakes;
    private readonly Histogram<double> _handshakeDuration;
    private readonly UpDownCounter<long> _connections;
    private readonly Counter<long> _errors;

    public TlsMetrics(IMeterFactory meterFactory, ActiveConfiguration active)
    {
        ArgumentNullException.ThrowIfNull(meterFactory);
        ArgumentNullException.ThrowIfNull(active);
        _meter = meterFactory.Create(MeterName);
        _byteTags = new KeyValuePair<string, object?>[_byteTotals.Length][];
        for (var i = 0; i < _byteTotals.Length; i++)
        {
            _byteTags[i] = [new("tern.tls.direction", s_directions[i / 2]), new("tern.tls.path", i % 2 == 0 ? Paths.Direct : Paths.Spill)];
        }

        _meter.CreateObservableCounter("tern.tls.bytes", ObserveBytes, "By", "TLS bytes by direction (decrypt: plaintext out; encrypt: ciphertext out; handshake: the handshake's records out; shutdown: close_notify out) and path (direct: written by OpenSSL straight into pipe memory; spill: through the spill buffer)");
        _spillEvents = _meter.CreateCounter<long>("tern.tls.spill.events", "{event}", "Native calls whose output did not fit the window and went to the spill buffer");
        _handshakes = _meter.CreateCounter<long>("tern.tls.handshakes", "{handshake}", "TLS handshakes by result, protocol, cipher, ALPN and resumption");
        _handshakeDuration = _meter.CreateHistogram<double>("tern.tls.handshake.duration", "s", "Time from the accepted connection to the end of the handshake",
            advice: new InstrumentAdvice<double> { HistogramBucketBoundaries = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10] });
        _errors = _meter.CreateCounter<long>("tern.tls.errors", "{error}", "Connections closed abortively by a TLS error after the handshake (bad record MAC, fatal alert, answers the client does not read)");
        _connections = _meter.CreateUpDownCounter<long>("tern.tls.connections.active", "{connection}", "Open connections that completed a TLS handshake");
        _meter.CreateObservableGauge("tern.tls.certificate.expiration_timestamp", () => ObserveExpiration(active.Current.Certificates), "s",
            "When each certificate served stops being valid, in seconds since the Unix epoch: the earliest notAfter of the certificate and the intermediates sent with it, by its name under Tern:Tls:Certificates ('self-signed' for Tern's own)");
    }

    // Read at each scrape from the configuration in force, so a reload's certificates (renewed,
    // added, removed) show at the next one. An intermediate that expires first breaks the chain
    // as surely as the leaf (as Envoy reports it).
    private static IEnumerable<Measurement<long>> ObserveExpiration(CertificateSet certificates)
    {
        foreach (var certificate in certificates.All)
        {
            var notAfter = certificate.Certificate.NotAfter;
            foreach (var intermediate in certificate.Chain)
            {
                notAfter = intermediate.NotAfter < notAfter ? intermediate.NotAfter : notAfter;
            }

            yield return new Measurement<long>(new DateTimeOffset(notAfter.ToUniversalTime()).ToUnixTimeSeconds(),
                new KeyValuePair<string, object?>("tern.tls.certificate.name", certificate.Name));
        }
    }

    /// <summary>Bytes written by OpenSSL straight into pipe memory.</summary>
    public void Direct(Direction direction, long count)
    {
        if (count > 0)
        {
            Interlocked.Add(ref _byteTotals[(int)direction * 2], count);
        }
    }

    /// <summary>One native call whose output did not fit its window: count bytes went through the spill buffer.</summary>
    public void Spilled(Direction direction, long count)
    {
        Interlocked.Add(ref _byteTotals[(int)direction * 2 + 1], count);
        _spillEvents.Add(1, new KeyValuePair<string, object?>("tern.tls.direction", s_directions[(int)direction]));
    }

    private IEnumerable<Measurement<long>> ObserveBytes()
    {
        for (var i = 0; i < _byteTotals.Length; i++)
        {
            var total = Volatile.Read(ref _byteTotals[i]);
            if (total > 0)
            {
                yield return new Measurement<long>(total, _byteTags[i]);
            }
        }
    }

    public void HandshakeSucceeded(TimeSpan duration, string protocol, string cipher, string alpn, bool resumed)
    {
        var tags = new TagList
        {
            { "tern.tls.handshake.result", "success" },
            { "tls.protocol.version", protocol },
            { "tls.cipher", cipher },
            { "network.protocol.name", alpn.Length == 0 ? "http/1.1" : alpn },
            { "tls.resumed", resumed },
        };
        _handshakes.Add(1, tags);
        _handshakeDuration.Record(duration.TotalSeconds, tags);
    }

    /// <summary>A failed handshake; reason is a short class ("timeout", "protocol", "closed", "plain_http", "client_certificate").</summary>
    public void HandshakeFailed(TimeSpan duration, string reason)
    {
        var tags = new TagList { { "tern.tls.handshake.result", "failure" }, { "error.type", reason } };
        _handshakes.Add(1, tags);
        _handshakeDuration.Record(duration.TotalSeconds, tags);
    }

    /// <summary>error.type of a connection whose peer closed or reset it in the middle of a record.</summary>
    public const string Truncated = "truncated";

    /// <summary>A connection ended by a TLS error after its handshake; kind is "decrypt", "encrypt" or "truncated".</summary>
    public void ConnectionFailed(string kind) => _errors.Add(1, new KeyValuePair<string, object?>("error.type", kind));

    public void ConnectionOpened() => _connections.Add(1);

    public void ConnectionClosed() => _connections.Add(-1);

    public void Dispose() => _meter.Dispose();
}
