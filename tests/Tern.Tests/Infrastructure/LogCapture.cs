using System.Collections.Concurrent;

namespace Tern.Tests.Infrastructure;

/// <summary>Keeps every log line an in-process Tern writes, so tests wait on what it says rather than on time.</summary>
public sealed class LogCapture : ILoggerProvider
{
    private readonly ConcurrentQueue<string> _lines = new();

    public IEnumerable<string> Lines => _lines;

    public ILogger CreateLogger(string categoryName) => new Logger(this, categoryName);

    /// <summary>Waits until a line contains text; returns the line, or fails listing what was logged.</summary>
    public async Task<string> WaitForAsync(string text, TimeSpan? timeout = null)
    {
        var deadline = DateTime.UtcNow + (timeout ?? TimeSpan.FromSeconds(15));
        while (DateTime.UtcNow < deadline)
        {
            var line = _lines.FirstOrDefault(l => l.Contains(text, StringComparison.Ordinal));
            if (line is not null)
            {
                return line;
            }

            await Task.Delay(50);
        }

        throw new TimeoutException($"no log line contains '{text}'; logged:\n{string.Join('\n', _lines)}");
    }

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
