using System.Collections.Concurrent;

namespace Tern.Tests.Infrastructure;

/// <summary>Keeps every log line an in-process Tern writes, so tests wait on what it says rather than on time.</summary>
public sealed class LogCapture : ILoggerProvider
{
    private readonly ConcurrentQueue<string> _lines = new();

    public IEnumerable<string> Lines => _lines;

    /// <summary>How many lines were logged so far; pass it as WaitForAsync's after to skip them.</summary>
    public int Count => _lines.Count;

    public ILogger CreateLogger(string categoryName) => new Logger(this, categoryName);

    /// <summary>
    /// Waits until a line contains text; returns the line, or fails listing what was logged. With
    /// after (a <see cref="Count"/> taken before an action), only lines logged since then count, so
    /// that a line an earlier step logged does not stand in for the one the action should log.
    /// </summary>
    public Task<string> WaitForAsync(string text, TimeSpan? timeout = null, int after = 0) =>
        LineWait.WaitForAsync(_lines.Skip(after), text, timeout,
            () => $"no log line{(after > 0 ? $" after the first {after}" : "")} contains '{text}'; logged:\n{string.Join('\n', _lines)}");

    public void Dispose()
    {
    }

    private sealed class Logger(LogCapture capture, string category) : ILogger
    {
        public IDisposable? BeginScope<TState>(TState state)
            where TState : notnull => null;

        public bool IsEnabled(LogLevel logLevel) => logLevel >= LogLevel.Debug;

        public void Log<TState>(LogLevel logLevel, EventId eventId, TState state, Exception? exception, Func<TState, Exception?, string> formatter)
        {
            if (IsEnabled(logLevel) && (category.StartsWith("Tern", StringComparison.Ordinal) || logLevel >= LogLevel.Warning))
            {
                capture._lines.Enqueue($"{logLevel}: {category}: {formatter(state, exception)}");
            }
        }
    }
}
