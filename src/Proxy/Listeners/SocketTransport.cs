using System.Net;
using System.Net.Sockets;
using System.Reflection;
using System.Runtime.InteropServices;
using Microsoft.AspNetCore.Connections;
using Microsoft.AspNetCore.Server.Kestrel.Transport.Sockets;
using Microsoft.Extensions.Options;

namespace Tern.Proxy.Listeners;

/// <summary>
/// Kestrel's socket transport with an accept loop of Tern's own, which does not spin when accepting
/// fails. Kestrel's loop takes every failed accept() for a client that reset its connection in the
/// backlog and tries again at once. When the process has as many files open as its limit allows
/// (EMFILE) or the system has (ENFILE), every accept() fails while a connection waits, so that loop
/// spun: with 500 clients against a limit of 400 files, Tern used 5.3 CPU seconds in 5 s, its two
/// cores, while serving nothing new, and logged nothing above Debug. This loop, as nginx's does,
/// waits <see cref="RetryDelay"/> before it tries again after any failure but a connection lost in
/// the backlog, and logs the failure once (then at most every <see cref="RepeatLogEvery"/> while
/// it lasts, and once when accepting works again). Clients wait in the kernel's listen backlog meanwhile; connections
/// already open are served as before.
/// </summary>
/// <remarks>
/// The connections are Kestrel's own: its public <see cref="SocketConnectionContextFactory"/> makes
/// them from the same options, as Kestrel's listener does, and the listen socket is bound the same
/// way. The factory's options are built with the internal constructor Kestrel itself uses, which
/// also carries Tern's <see cref="BlockPool"/>; the public one would put 4 KB blocks back under
/// every socket. Should a later runtime lack that constructor, <see cref="Available"/> is false and
/// Tern keeps Kestrel's transport (and says so at start).
/// </remarks>
internal sealed partial class SocketTransport(IOptions<SocketTransportOptions> options, ILoggerFactory loggers) : IConnectionListenerFactory, IConnectionListenerFactorySelector
{
    /// <summary>How long the loop waits after a failed accept before it tries again (nginx: 500 ms).</summary>
    public static readonly TimeSpan RetryDelay = TimeSpan.FromMilliseconds(100);

    /// <summary>The shortest time between two lines about failing accepts on one listener.</summary>
    public static readonly TimeSpan RepeatLogEvery = TimeSpan.FromSeconds(10);

    private static readonly ConstructorInfo? s_factoryOptions = typeof(SocketConnectionFactoryOptions).GetConstructor(
        BindingFlags.NonPublic | BindingFlags.Instance, [typeof(SocketTransportOptions)]);

    private readonly ILogger _logger = loggers.CreateLogger("Tern.Proxy.Listeners");

    /// <summary>Whether this runtime's Kestrel has what the transport needs (see remarks).</summary>
    public static bool Available => s_factoryOptions is not null;

    public ValueTask<IConnectionListener> BindAsync(EndPoint endpoint, CancellationToken cancellationToken = default)
    {
        var transport = options.Value;
        Socket socket;
        try
        {
            socket = transport.CreateBoundListenSocket(endpoint);
        }
        catch (SocketException e) when (e.SocketErrorCode == SocketError.AddressAlreadyInUse)
        {
            throw new AddressInUseException(e.Message, e); // what Kestrel's own transport throws: its message names the endpoint
        }

        _ = OpenFileLimit(); // binds the call now: at the limit, loading a library can fail
        try
        {
            socket.Listen(transport.Backlog);
            var factoryOptions = (SocketConnectionFactoryOptions)s_factoryOptions!.Invoke([transport]);
            var factory = new SocketConnectionContextFactory(factoryOptions, loggers.CreateLogger("Microsoft.AspNetCore.Server.Kestrel.Transport.Sockets"));
            return new(new Listener(socket, factory, transport.NoDelay, transport.Backlog, _logger));
        }
        catch
        {
            socket.Dispose();
            throw;
        }
    }

    public bool CanBind(EndPoint endpoint) => endpoint is IPEndPoint; // Tern listens on TCP ports only

    /// <summary>
    /// Errors accept() returns for one connection that failed while it waited in the backlog (Linux
    /// passes the connection's pending network error on, and drops it: accept(2)), so the next one
    /// may be fine. Each takes a connection off the backlog, so retrying them at once cannot spin.
    /// </summary>
    internal static bool LostInBacklog(SocketError error) => error is SocketError.ConnectionAborted or SocketError.ConnectionReset
        or SocketError.TimedOut or SocketError.NetworkDown or SocketError.NetworkUnreachable or SocketError.NetworkReset
        or SocketError.HostDown or SocketError.HostUnreachable or SocketError.ProtocolOption or SocketError.ProtocolType
        or SocketError.OperationNotSupported;

    /// <summary>The process's limit on open files (RLIMIT_NOFILE), read without opening one; null if it cannot be read.</summary>
    internal static ulong? OpenFileLimit()
    {
        try
        {
            return GetRLimit(RLimitNoFile, out var limit) == 0 ? limit.Current : null;
        }
        catch (Exception ex) when (ex is DllNotFoundException or EntryPointNotFoundException)
        {
            return null;
        }
    }

    private const int RLimitNoFile = 7; // Linux, every architecture .NET runs on

    [StructLayout(LayoutKind.Sequential)]
    private struct RLimit
    {
        public ulong Current;
        public ulong Maximum;
    }

    [LibraryImport("libc", EntryPoint = "getrlimit")]
    private static partial int GetRLimit(int resource, out RLimit limit);

    private sealed class Listener(Socket socket, SocketConnectionContextFactory factory, bool noDelay, int backlog, ILogger logger) : IConnectionListener
    {
        private readonly CancellationTokenSource _unbound = new();
        private readonly string _endpoint = socket.LocalEndPoint?.ToString() ?? "?";

        // Failed accepts since the last line that reported them, when the first of them failed, when
        // that line was written, and whether a line that accepting works again is owed.
        private long _failures;
        private long _firstFailure;
        private long _reportedAt = long.MinValue;
        private bool _recoveryOwed;

        public EndPoint EndPoint { get; } = socket.LocalEndPoint!;

        public async ValueTask<ConnectionContext?> AcceptAsync(CancellationToken cancellationToken = default)
        {
            while (true)
            {
                Socket accepted;
                try
                {
                    accepted = await socket.AcceptAsync(cancellationToken);
                }
                catch (ObjectDisposedException)
                {
                    return null; // unbound
                }
                catch (SocketException e) when (e.SocketErrorCode == SocketError.OperationAborted)
                {
                    return null; // unbound
                }
                catch (SocketException e) when (LostInBacklog(e.SocketErrorCode))
                {
                    continue;
                }
                catch (SocketException e)
                {
                    Failed(e);
                    try
                    {
                        await Task.Delay(RetryDelay, _unbound.Token);
                    }
                    catch (OperationCanceledException)
                    {
                        return null;
                    }

                    continue;
                }

                if (_recoveryOwed)
                {
                    Recovered();
                }

                try
                {
                    if (noDelay)
                    {
                        accepted.NoDelay = true;
                    }
                }
                catch (SocketException)
                {
                    accepted.Dispose(); // gone between accept() and setsockopt()
                    continue;
                }

                return factory.Create(accepted);
            }
        }

        // At most one line about failures every RepeatLogEvery, and one about recovering after each:
        // at the limit, connections that close let a few accepts through, and each would otherwise
        // make a pair of lines.
        private void Failed(SocketException e)
        {
            var now = Environment.TickCount64;
            if (_failures++ == 0)
            {
                _firstFailure = now;
            }

            if (_reportedAt != long.MinValue && now - _reportedAt < (long)RepeatLogEvery.TotalMilliseconds)
            {
                return;
            }

            // .NET reports EMFILE (the process's limit) and ENFILE (the system's) as one error, whose
            // message is ENFILE's; the advice covers both.
            var (reason, advice) = e.SocketErrorCode == SocketError.TooManyOpenSockets
                ? ("too many open files",
                   $"Tern has as many files open as it may ({(OpenFileLimit() is { } limit ? $"its limit, RLIMIT_NOFILE, is {limit}" : "RLIMIT_NOFILE")}), or the system has (fs.file-max): raise the limit (ulimit -n, systemd's LimitNOFILE, the container runtime's nofile), or cap connections with Kestrel:Limits:MaxConcurrentConnections.")
                : (e.Message, $"Tern tries again until it works ({e.SocketErrorCode}).");
            TernLog.AcceptFailing(logger, _endpoint, reason, _failures, (now - _firstFailure) / 1000.0, backlog, (int)RetryDelay.TotalMilliseconds, advice);
            _reportedAt = now;
            _failures = 0;
            _recoveryOwed = true;
        }

        private void Recovered()
        {
            TernLog.AcceptRecovered(logger, _endpoint, (Environment.TickCount64 - _reportedAt) / 1000.0, _failures);
            _recoveryOwed = false;
            _failures = 0;
        }

        public ValueTask UnbindAsync(CancellationToken cancellationToken = default)
        {
            _unbound.Cancel();
            socket.Dispose();
            return default;
        }

        public ValueTask DisposeAsync()
        {
            _unbound.Cancel();
            socket.Dispose();
            factory.Dispose();
            _unbound.Dispose();
            return default;
        }
    }
}
