using System.Globalization;

namespace Tern.Proxy.Listeners;

/// <summary>
/// How long an idle thread-pool worker spins for new work before it sleeps. Tern.Proxy.csproj sets
/// the runtime's limit (System.Threading.ThreadPool.UnfairSemaphoreSpinLimit) in the shipped
/// runtimeconfig; the runtime's own default is 70. Tern's thread-pool work is queued by the socket
/// event threads (a new connection, a closed one), so a spinning worker mostly waits for work that
/// cannot arrive while it holds the CPU: on a process with one CPU, two idle workers yield the CPU
/// to each other about 70 times per work item (loadtest/README.md, "the thread pool's spinning").
/// The runtime reads the limit once, when the thread pool starts, from the environment first
/// (DOTNET_ThreadPool_UnfairSemaphoreSpinLimit, a hexadecimal number) and then from the
/// runtimeconfig; this class only reports which is in force.
/// </summary>
internal static class ThreadPoolSpin
{
    /// <summary>The runtime's environment variable; it overrides the runtimeconfig and is read as hexadecimal.</summary>
    public const string Variable = "DOTNET_ThreadPool_UnfairSemaphoreSpinLimit";

    /// <summary>The runtimeconfig property Tern.Proxy.csproj sets.</summary>
    public const string Property = "System.Threading.ThreadPool.UnfairSemaphoreSpinLimit";

    /// <summary>The limit the runtime uses when neither is set (.NET 8 to 10).</summary>
    public const int RuntimeDefault = 70;

    /// <summary>The limit in force and where it comes from, read the way the runtime reads it.</summary>
    public static (int Limit, string Source) Effective()
    {
        var text = Environment.GetEnvironmentVariable(Variable);
        if (text is not null)
        {
            var digits = text.StartsWith("0x", StringComparison.Ordinal) ? text[2..] : text;
            if (uint.TryParse(digits, NumberStyles.HexNumber, CultureInfo.InvariantCulture, out var fromEnvironment) && fromEnvironment <= int.MaxValue)
            {
                return ((int)fromEnvironment, $"{Variable}={text}, read as hexadecimal");
            }
        }

        const string Shipped = "Tern's default; " + Variable + ", in hexadecimal, overrides it";
        return AppContext.GetData(Property) switch
        {
            string s when int.TryParse(s, NumberStyles.Integer, CultureInfo.InvariantCulture, out var fromConfig) && fromConfig >= 0 => (fromConfig, Shipped),
            uint u when u <= int.MaxValue => ((int)u, Shipped),
            int i when i >= 0 => (i, Shipped),
            _ => (RuntimeDefault, "the runtime's default"),
        };
    }
}
