namespace Tern.Tests.Infrastructure;

/// <summary>Waiting on lines that something writes as it goes (log lines, a child's output).</summary>
public static class LineWait
{
    /// <summary>
    /// Waits until one of lines (read again on every try) contains text; returns it, or throws with
    /// describe's account of what was written.
    /// </summary>
    public static async Task<string> WaitForAsync(IEnumerable<string> lines, string text, TimeSpan? timeout, Func<string> describe)
    {
        var deadline = DateTime.UtcNow + (timeout ?? TimeSpan.FromSeconds(15));
        while (DateTime.UtcNow < deadline)
        {
            var line = lines.FirstOrDefault(l => l.Contains(text, StringComparison.Ordinal));
            if (line is not null)
            {
                return line;
            }

            await Task.Delay(50);
        }

        throw new TimeoutException(describe());
    }
}
