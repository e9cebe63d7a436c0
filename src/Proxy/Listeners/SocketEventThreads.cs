namespace Tern.Proxy.Listeners;

/// <summary>
/// Where each connection's work runs. By default Tern serves a connection on the runtime's socket
/// event thread that saw its data (one such thread per core, nginx's model) instead of handing
/// every read and write on to the thread pool: on small requests those handoffs cost more CPU than
/// the TLS records (loadtest/README.md). Nothing in Tern's request path blocks a thread, and Tern
/// runs no user code, which is what makes this safe. The runtime reads its switch once, at the
/// first socket operation, which is why the entry point sets it before building anything; an
/// operator turns it off with DOTNET_SYSTEM_NET_SOCKETS_INLINE_COMPLETIONS=0.
/// </summary>
internal static class SocketEventThreads
{
    /// <summary>The runtime's switch (System.Net.Sockets reads it; "1" is on).</summary>
    public const string Variable = "DOTNET_SYSTEM_NET_SOCKETS_INLINE_COMPLETIONS";

    /// <summary>Tern's default: on, unless the operator set the variable. Call before any socket is used.</summary>
    public static void DefaultOn()
    {
        if (string.IsNullOrEmpty(Environment.GetEnvironmentVariable(Variable)))
        {
            Environment.SetEnvironmentVariable(Variable, "1");
        }
    }

    /// <summary>Whether socket completions run on the event threads (the runtime takes exactly "1").</summary>
    public static bool Enabled => Environment.GetEnvironmentVariable(Variable) == "1";
}
