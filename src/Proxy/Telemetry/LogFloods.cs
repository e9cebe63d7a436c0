using Tern.Proxy.Forwarding;

namespace Tern.Proxy.Telemetry;

/// <summary>
/// Log lines a client can cause at will, each event written at most a few times per window; at
/// the window's end one more line says how many were left out, if any were. Every other line
/// passes as it is.
/// </summary>
/// <remarks>
/// <para>
/// Kestrel's line for an HTTP/2 client that resets streams faster than Kestrel can clear them
/// (event 60, "exceeded the output operations maximum queue size"): Kestrel closes such a
/// connection, as it should, but logs it at Critical, and again for every stream the client had
/// queued: 1,000 streams opened and reset on one connection made about 100 Critical lines, so any
/// client could fill the log and page whoever alerts on Critical (dotnet/aspnetcore#53377 reports
/// it from a YARP edge). It costs Tern little CPU (20 such connections: 0.17 CPU seconds, none of
/// it forwarded), so the line is the harm. Kestrel's <c>kestrel.connection.duration</c> counts
/// each such connection under <c>error.type=output_queue_size_exceeded</c>. Written at Warning,
/// once per 10 s.
/// </para>
/// <para>
/// Tern's per-request lines (Tern.Proxy.Forwarding, events 300-399): a client that leaves before
/// its answer, resets its streams, sends bodies Kestrel refuses or requests that two routes match
/// alike, and any request while an upstream is down, each made one line. Written to a file, those
/// lines took 15-20% of the requests per second a dead upstream is answered at, and a client can
/// send them as fast as it likes; a second's first <see cref="RequestLinesPerSecond"/> of each event
/// are written. The metrics count every request.
/// </para>
/// <para>
/// The OTLP exporter's problems (<see cref="OtlpExportLog"/>): a collector that cannot be reached
/// fails every export interval; one line per minute.
/// </para>
/// <para>
/// YARP's line for an affinity cookie or header it cannot decrypt (event 38 of its Cookie and
/// CustomHeader policies): any client can send one, and a cookie another replica set is one, yet
/// YARP wrote each at Error with the exception's stack. At Warning, once per 10 s, its reason in
/// place of the stack; the request is served (YARP picks a destination again).
/// </para>
/// <para>
/// YARP's failed active health probe (event 17): a dead destination made a warning with the
/// exception's whole stack (about 3 KB) at every probe interval; one line per minute for each
/// destination, its reason
/// (Connection refused (10.0.0.5:8080)) in place of the stack. YARP's line for a destination's
/// change of health (event 49) passes as it is.
/// </para>
/// </remarks>
internal sealed class LogFloods : ILoggerFactory
{
    public const string KestrelHttp2 = "Microsoft.AspNetCore.Server.Kestrel.Http2";

    /// <summary>Kestrel's Http2QueueOperationsExceeded.</summary>
    public const int KestrelHttp2Flood = 60;

    public const string Forwarding = "Tern.Proxy.Forwarding";

    public const int RequestLinesPerSecond = 10;

    /// <summary>Keyed windows kept before idle ones are dropped.</summary>
    public const int KeyedWindows = 256;

    public const string Telemetry = "Tern.Proxy.Telemetry";

    public const string YarpHealthProbes = "Yarp.ReverseProxy.Health.ActiveHealthCheckMonitor";

    /// <summary>YARP's line for a failed active health probe, with the exception's whole stack.</summary>
    public const int YarpProbeFailed = 17;

    public const string YarpCookieAffinity = "Yarp.ReverseProxy.SessionAffinity.CookieSessionAffinityPolicy";

    public const string YarpHeaderAffinity = "Yarp.ReverseProxy.SessionAffinity.CustomHeaderSessionAffinityPolicy";

    /// <summary>YARP's line for an affinity key it could not decrypt, at Error with the exception's whole stack.</summary>
    public const int YarpAffinityUnreadable = 38;

    /// <summary>OtlpExportLog's event: the exporter's problems, once per export interval.</summary>
    public const int OtlpExport = 500;

    private readonly ILoggerFactory _inner;
    private readonly Rule[] _rules;
    private readonly Lock _lock = new();
    private readonly List<Window> _armed = [];
    private bool _disposed;

    /// <param name="inner">The factory that writes.</param>
    /// <param name="kestrelWindow">The window of Kestrel's flood line (10 s; shorter in tests).</param>
    /// <param name="requestWindow">The window of Tern's per-request lines (1 s; shorter in tests).</param>
    /// <param name="probeWindow">The window of each destination's failed-probe line (60 s; shorter in tests).</param>
    public LogFloods(ILoggerFactory inner, TimeSpan? kestrelWindow = null, TimeSpan? requestWindow = null, TimeSpan? probeWindow = null)
    {
        const long otlpMs = 60_000;
        var probeMs = (long)(probeWindow ?? TimeSpan.FromMinutes(1)).TotalMilliseconds;
        _inner = inner;
        var kestrelMs = (long)(kestrelWindow ?? TimeSpan.FromSeconds(10)).TotalMilliseconds;
        var requestMs = (long)(requestWindow ?? TimeSpan.FromSeconds(1)).TotalMilliseconds;
        _rules =
        [
            new(KestrelHttp2, KestrelHttp2Flood, KestrelHttp2Flood, 1, kestrelMs, LogLevel.Warning,
                _ => $" Kestrel closed it: the client reset HTTP/2 streams faster than they could be cleared (a flood). At most one such line every {Seconds(kestrelMs)} s; how many more came follows at the end of that time.",
                (_, _, n) => $"Kestrel's line for an HTTP/2 flood (event 60) came {n} more time{(n == 1 ? "" : "s")} in the {Seconds(kestrelMs)} s after the last one written, and was left out."),
            new(Forwarding, 300, 399, RequestLinesPerSecond, requestMs, null, null,
                (id, _, n) => $"Event {id} came {n} more time{(n == 1 ? "" : "s")} within {Seconds(requestMs)} s of its first line, beyond the {RequestLinesPerSecond} written, and was left out (Tern writes at most {RequestLinesPerSecond} lines of each per-request event per {Seconds(requestMs)} s; the metrics count every request)."),
            new(Telemetry, OtlpExport, OtlpExport, 1, otlpMs, null, null,
                (_, _, n) => $"The OTLP exporter reported {n} more problem{(n == 1 ? "" : "s")} in the {Seconds(otlpMs)} s after the last one written, left out."),
            .. ((string[])[YarpCookieAffinity, YarpHeaderAffinity]).Select(category => new Rule(category, YarpAffinityUnreadable, YarpAffinityUnreadable, 1, kestrelMs, LogLevel.Warning,
                exception => $" {Reason(exception)}. The client's affinity key was set by another replica or before a restart (Data Protection keys not shared), or altered; YARP picked a destination again. At most one such line every {Seconds(kestrelMs)} s; how many more came follows at the end of that time.",
                (_, _, n) => $"YARP's line for an affinity key it could not decrypt (event {YarpAffinityUnreadable}) came {n} more time{(n == 1 ? "" : "s")} in the {Seconds(kestrelMs)} s after the last one written, and was left out.")),
            new(YarpHealthProbes, YarpProbeFailed, YarpProbeFailed, 1, probeMs, null,
                exception => $" {(exception is OperationCanceledException ? "No answer within the cluster's HealthCheck:Active:Timeout" : Reason(exception))}. At most one such line for each destination every {Seconds(probeMs)} s; how many more came follows at the end of that time.",
                (_, destination, n) => $"YARP's active health probes of {destination} failed {n} more time{(n == 1 ? "" : "s")} in the {Seconds(probeMs)} s after the last line written, left out (a destination's change of health is logged each time).")
            {
                // Each destination's own window: a second dead one's reason is written too.
                Key = state => $"destination `{Value(state, "destinationId")}` on cluster `{Value(state, "clusterId")}`",
            },
        ];
    }

    public ILogger CreateLogger(string categoryName)
    {
        foreach (var rule in _rules)
        {
            if (rule.Category == categoryName)
            {
                return rule.Logger ??= new Logger(_inner.CreateLogger(categoryName), rule, this);
            }
        }

        return _inner.CreateLogger(categoryName);
    }

    public void AddProvider(ILoggerProvider provider) => _inner.AddProvider(provider);

    /// <summary>How many keyed windows a category's rule holds (for tests).</summary>
    internal int KeyedWindowCount(string category)
    {
        lock (_lock)
        {
            return _rules.Where(r => r.Category == category).Sum(r => r.Keyed.Count);
        }
    }

    public void Dispose()
    {
        lock (_lock)
        {
            _disposed = true;
        }

        foreach (var window in _armed)
        {
            window.Dispose();
        }

        _inner.Dispose();
    }

    /// <summary>
    /// What an exception says, for a line in place of its stack: its own message and, where it
    /// does not hold it already, its innermost one (Connection refused (10.0.0.5:8080); The SSL
    /// connection could not be established, see inner exception: The remote certificate is
    /// invalid ...), without a final period.
    /// </summary>
    private static string Reason(Exception? exception)
    {
        if (exception is null)
        {
            return "-";
        }

        var outer = exception.Message.TrimEnd('.');
        var innermost = ProxyErrorResponses.Detail(exception).TrimEnd('.');
        return outer.Contains(innermost, StringComparison.Ordinal) ? outer : $"{outer}: {innermost}";
    }

    private static string? Value(IReadOnlyList<KeyValuePair<string, object?>> state, string name)
    {
        foreach (var (key, value) in state)
        {
            if (key == name)
            {
                return value?.ToString();
            }
        }

        return null;
    }

    private static string Seconds(long ms) => (ms / 1000.0).ToString("0.#", System.Globalization.CultureInfo.InvariantCulture);

    /// <summary>
    /// Which events of a category are held to Lines per window (from the first line written in
    /// it); Level, if set, is the level they are written at (else their own), with Suffix (made
    /// from the exception, whose stack is then left out) after their text; Count is the line at a
    /// window's end, from the event, the window's key and how many were left out.
    /// </summary>
    private sealed record Rule(string Category, int FirstEvent, int LastEvent, int Lines, long WindowMs, LogLevel? Level, Func<Exception?, string>? Suffix, Func<int, string?, int, string> Count)
    {
        /// <summary>Each event's window, made at its first line; shared by every logger of the category.</summary>
        public Window?[] Windows { get; } = new Window?[LastEvent - FirstEvent + 1];

        /// <summary>If set, each value it gives a line's state has a window of its own (for events the configuration bounds, such as a destination's).</summary>
        public Func<IReadOnlyList<KeyValuePair<string, object?>>, string>? Key { get; init; }

        /// <summary>The windows by key, under the owner's lock.</summary>
        public Dictionary<(int Event, string Key), Window> Keyed { get; } = [];

        /// <summary>The category's logger, made once (ProxyErrorResponses asks for it on each request it logs).</summary>
        public Logger? Logger { get; set; }
    }

    /// <summary>One event's window: who writes its count, and the timer that does it at the window's end.</summary>
    private sealed class Window(LogFloods owner, Rule rule, int eventId, string? key, LogLevel level, ILogger writer) : IDisposable
    {
        private long _endsAt;
        private int _written;
        private int _leftOut;
        private Timer? _timer;

        /// <summary>
        /// Whether to write this one; if not, it is counted, for the window's end. A line that opens a
        /// new window first takes the last window's count, if its timer has not written it yet.
        /// </summary>
        public bool Take(out int lastWindow)
        {
            var now = Environment.TickCount64;
            lock (owner._lock)
            {
                lastWindow = 0;
                if (now >= _endsAt)
                {
                    lastWindow = _leftOut;
                    _leftOut = 0;
                    _written = 0;
                    _endsAt = now + rule.WindowMs;
                }

                if (++_written <= rule.Lines)
                {
                    return true;
                }

                if (++_leftOut == 1 && !owner._disposed)
                {
                    if (_timer is null)
                    {
                        _timer = new Timer(static s => ((Window)s!).Flush(), this, Timeout.Infinite, Timeout.Infinite);
                        owner._armed.Add(this);
                    }

                    _timer.Change(_endsAt - now, Timeout.Infinite);
                }

                return false;
            }
        }

        /// <summary>Whether its time is over with nothing left to count (under the owner's lock).</summary>
        public bool Idle(long now) => now >= _endsAt && _leftOut == 0;

        public void Dispose() => _timer?.Dispose();

        /// <summary>At a window's end (the timer): how many lines were left out in it.</summary>
        private void Flush()
        {
            int leftOut;
            lock (owner._lock)
            {
                leftOut = owner._disposed ? 0 : _leftOut;
                _leftOut = 0;
            }

            WriteCount(leftOut);
        }

        public void WriteCount(int leftOut)
        {
            if (leftOut == 0 || !writer.IsEnabled(level))
            {
                return;
            }

            try
            {
                writer.Log(level, new EventId(eventId), leftOut, null, (n, _) => rule.Count(eventId, key, n));
            }
            catch (Exception)
            {
                // On the timer's thread an exception would end the process; a logger that fails
                // (a full disk, say) loses this line, as it loses any other.
            }
        }
    }

    private sealed class Logger(ILogger inner, Rule rule, LogFloods owner) : ILogger
    {
        /// <summary>
        /// Under the owner's lock, past <see cref="KeyedWindows"/> windows: drops those whose time
        /// is over with nothing left to count (destinations a reload removed, pods long gone), so
        /// that keys the configuration changes do not pile up.
        /// </summary>
        private void Prune(Dictionary<(int Event, string Key), Window> keyed)
        {
            if (keyed.Count < KeyedWindows)
            {
                return;
            }

            var now = Environment.TickCount64;
            foreach (var (key, window) in keyed.Where(k => k.Value.Idle(now)).ToList())
            {
                keyed.Remove(key);
                owner._armed.Remove(window);
                window.Dispose();
            }
        }

        public IDisposable? BeginScope<TState>(TState state)
            where TState : notnull => inner.BeginScope(state);

        // A line that comes above the level it leaves at (Kestrel's Critical, written at Warning) is enabled if either is.
        public bool IsEnabled(LogLevel logLevel) => inner.IsEnabled(logLevel) || (rule.Level is { } level && logLevel > level && inner.IsEnabled(level));

        public void Log<TState>(LogLevel logLevel, EventId eventId, TState state, Exception? exception, Func<TState, Exception?, string> formatter)
        {
            var windows = rule.Windows;
            var index = eventId.Id - rule.FirstEvent;
            if ((uint)index >= (uint)windows.Length)
            {
                inner.Log(logLevel, eventId, state, exception, formatter);
                return;
            }

            var level = rule.Level ?? logLevel;
            if (!inner.IsEnabled(level))
            {
                return;
            }

            Window window;
            if (rule.Key is { } keyOf && state is IReadOnlyList<KeyValuePair<string, object?>> values)
            {
                var key = keyOf(values);
                lock (owner._lock)
                {
                    if (!rule.Keyed.TryGetValue((eventId.Id, key), out window!))
                    {
                        Prune(rule.Keyed);
                        rule.Keyed[(eventId.Id, key)] = window = new Window(owner, rule, eventId.Id, key, level, inner);
                    }
                }
            }
            else
            {
                window = windows[index] ?? Interlocked.CompareExchange(ref windows[index], new Window(owner, rule, eventId.Id, null, level, inner), null) ?? windows[index]!;
            }

            if (!window.Take(out var lastWindow))
            {
                return;
            }

            window.WriteCount(lastWindow);
            if (rule.Suffix is { } suffix)
            {
                // The exception's stack says nothing an operator can act on (Kestrel's only repeats
                // the message; YARP's probe is a connection refused): its message, if any, ends the line.
                inner.Log(level, eventId, state, null, (s, _) => formatter(s, null) + suffix(exception));
            }
            else
            {
                inner.Log(level, eventId, state, exception, formatter);
            }
        }
    }
}
