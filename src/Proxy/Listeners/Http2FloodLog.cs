namespace Tern.Proxy.Listeners;

/// <summary>
/// Kestrel's line for an HTTP/2 client that resets streams faster than Kestrel can clear them
/// (event 60, "exceeded the output operations maximum queue size"), at most once per
/// <see cref="Every"/> and at Warning; at the end of that time, one more line says how many were
/// left out, if any were.
/// </summary>
/// <remarks>
/// Kestrel closes such a connection, as it should, but logs the event at Critical, and again for
/// every stream the client had queued: 1,000 streams opened and reset on one connection made
/// about 100 Critical lines, so any client could fill the log and page whoever alerts on
/// Critical (dotnet/aspnetcore#53377 reports it from a YARP edge). It costs Tern little CPU (20 such
/// connections: 0.17 CPU seconds, none of it forwarded), so the line is the harm. Kestrel's
/// <c>kestrel.connection.duration</c> counts each such connection under
/// <c>error.type=output_queue_size_exceeded</c>. Only this event of this category is touched:
/// Kestrel's other HTTP/2 lines pass as they are.
/// </remarks>
internal sealed class Http2FloodLog(ILoggerFactory inner, TimeSpan? every = null) : ILoggerFactory
{
    public const string Category = "Microsoft.AspNetCore.Server.Kestrel.Http2";

    /// <summary>Kestrel's Http2QueueOperationsExceeded.</summary>
    public const int EventId = 60;

    public static readonly TimeSpan Every = TimeSpan.FromSeconds(10);

    private readonly long _everyMs = (long)(every ?? Every).TotalMilliseconds;
    private readonly Lock _lock = new();
    private long _nextAt;
    private int _leftOut;

    // The category's own logger, which writes the count at the end of a window, and the timer that
    // does it (armed by the first line left out in a window).
    private ILogger? _writer;
    private Timer? _timer;
    private bool _disposed;

    public ILogger CreateLogger(string categoryName)
    {
        var logger = inner.CreateLogger(categoryName);
        if (categoryName != Category)
        {
            return logger;
        }

        _writer ??= logger;
        return new Logger(logger, this);
    }

    public void AddProvider(ILoggerProvider provider) => inner.AddProvider(provider);

    public void Dispose()
    {
        lock (_lock)
        {
            _disposed = true;
        }

        _timer?.Dispose();
        inner.Dispose();
    }

    /// <summary>
    /// Whether to write this one; if not, it is counted, for the window's end. A line that opens a
    /// new window first takes the last window's count, if its timer has not written it yet.
    /// </summary>
    private bool Take(out int lastWindow)
    {
        var now = Environment.TickCount64;
        lock (_lock)
        {
            if (now < _nextAt)
            {
                lastWindow = 0;
                if (++_leftOut == 1 && !_disposed)
                {
                    _timer ??= new Timer(static s => ((Http2FloodLog)s!).Flush(), this, Timeout.Infinite, Timeout.Infinite);
                    _timer.Change(_nextAt - now, Timeout.Infinite);
                }

                return false;
            }

            _nextAt = now + _everyMs;
            lastWindow = _leftOut;
            _leftOut = 0;
            return true;
        }
    }

    /// <summary>At a window's end (the timer): how many lines were left out in it.</summary>
    private void Flush()
    {
        int leftOut;
        lock (_lock)
        {
            leftOut = _disposed ? 0 : _leftOut;
            _leftOut = 0;
        }

        WriteCount(_writer, leftOut);
    }

    private void WriteCount(ILogger? writer, int leftOut)
    {
        if (leftOut == 0 || writer is null || !writer.IsEnabled(LogLevel.Warning))
        {
            return;
        }

        try
        {
            writer.Log(LogLevel.Warning, new EventId(EventId), leftOut, null,
                (n, _) => $"Kestrel's line for an HTTP/2 flood (event 60) came {n} more time{(n == 1 ? "" : "s")} in the {_everyMs / 1000.0:0.#} s after the last one written, and was left out.");
        }
        catch (Exception)
        {
            // On the timer's thread an exception would end the process; a logger that fails
            // (a full disk, say) loses this line, as it loses any other.
        }
    }

    private sealed class Logger(ILogger inner, Http2FloodLog owner) : ILogger
    {
        public IDisposable? BeginScope<TState>(TState state)
            where TState : notnull => inner.BeginScope(state);

        // Event 60 comes at Critical and leaves at Warning: enabled if either is.
        public bool IsEnabled(LogLevel logLevel) => inner.IsEnabled(logLevel) || (logLevel == LogLevel.Critical && inner.IsEnabled(LogLevel.Warning));

        public void Log<TState>(LogLevel logLevel, EventId eventId, TState state, Exception? exception, Func<TState, Exception?, string> formatter)
        {
            if (eventId.Id != EventId)
            {
                inner.Log(logLevel, eventId, state, exception, formatter);
                return;
            }

            if (owner.Take(out var lastWindow) && inner.IsEnabled(LogLevel.Warning))
            {
                owner.WriteCount(inner, lastWindow);
                // The exception only repeats the message; it was never thrown, so it has no stack.
                var suffix = $" Kestrel closed it: the client reset HTTP/2 streams faster than they could be cleared (a flood). At most one such line every {owner._everyMs / 1000.0:0.#} s; how many more came follows at the end of that time.";
                inner.Log(LogLevel.Warning, eventId, state, null, (s, _) => formatter(s, null) + suffix);
            }
        }
    }
}
