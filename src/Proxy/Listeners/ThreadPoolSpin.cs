using System.Globalization;
using System.Runtime.InteropServices;

namespace Tern.Proxy.Listeners;

/// <summary>
/// Reports how long an idle thread-pool worker spins for new work before it sleeps. Tern ships the
/// limit at 0; Tern.Proxy.csproj says why. The runtime reads the limit once, when the thread pool
/// starts, from the environment first (DOTNET_ThreadPool_UnfairSemaphoreSpinLimit, else
/// COMPlus_..., a hexadecimal number) and then from the runtimeconfig; this class only reports
/// which is in force.
/// </summary>
internal static class ThreadPoolSpin
{
    /// <summary>The runtime's environment variable; it overrides the runtimeconfig and is read as hexadecimal.</summary>
    public const string Variable = "DOTNET_ThreadPool_UnfairSemaphoreSpinLimit";

    /// <summary>The runtimeconfig property Tern.Proxy.csproj sets.</summary>
    public const string Property = "System.Threading.ThreadPool.UnfairSemaphoreSpinLimit";

    /// <summary>The older name of the variable, which the runtime reads when the new one is not set.</summary>
    public const string LegacyVariable = "COMPlus_ThreadPool_UnfairSemaphoreSpinLimit";

    /// <summary>The limit the runtime uses when neither is set (.NET 8 to 10): 70, four times that on Arm.</summary>
    public static int RuntimeDefault => RuntimeInformation.ProcessArchitecture is Architecture.Arm64 or Architecture.Arm or Architecture.LoongArch64 ? 280 : 70;

    /// <summary>The limit in force and where it comes from, read the way the runtime reads it.</summary>
    public static (int Limit, string Source) Effective()
    {
        var name = Environment.GetEnvironmentVariable(Variable) is null ? LegacyVariable : Variable;
        var text = Environment.GetEnvironmentVariable(name);
        if (text is not null)
        {
            var digits = text.StartsWith("0x", StringComparison.Ordinal) ? text[2..] : text;
            if (uint.TryParse(digits, NumberStyles.HexNumber, CultureInfo.InvariantCulture, out var fromEnvironment) && fromEnvironment <= int.MaxValue)
            {
                return ((int)fromEnvironment, $"{name}={text}, read as hexadecimal");
            }
        }

        // A runtimeconfig property reaches AppContext as a string.
        return AppContext.GetData(Property) is string s && int.TryParse(s, NumberStyles.Integer, CultureInfo.InvariantCulture, out var fromConfig) && fromConfig >= 0
            ? (fromConfig, "Tern's default; " + Variable + ", in hexadecimal, overrides it")
            : (RuntimeDefault, "the runtime's default");
    }
}
