using System.Diagnostics.Metrics;
using System.Globalization;
using System.Net;
using System.Net.Sockets;
using System.Reflection;
using Microsoft.AspNetCore.Connections;
using Microsoft.AspNetCore.Server.Kestrel.Transport.Sockets;
using Microsoft.Extensions.Options;
using Tern.Proxy.Configuration;

namespace Tern.Proxy.Listeners;

/// <summary>
/// Kestrel's socket transport with an accept loop of Tern's own, which keeps the process clear of its
/// open-file limit and does not spin when accepting fails.
/// <list type="bullet">
/// <item>Kestrel's loop takes every failed accept() for a client that reset its connection in the
/// backlog and tries again at once. When the process has as many files open as its limit allows
/// (EMFILE) or the system has (ENFILE), every accept() fails while a client waits, so that loop
/// spun: with 500 clients against a limit of 400 files, Tern used 5.3 CPU seconds in 5 s, its two
/// cores, serving nothing new and logging nothing above Debug. This loop waits
/// <see cref="RetryDelay"/> after any failure but a connection lost in the backlog.</item>
/// <item>A .NET process with no descriptor free can die: a new thread needs a pipe, and the runtime
/// does not survive failing to start some of its own (the thread pool's gate thread aborted the
/// process with "Out of memory." in 6 of 69 runs of OpenFileLimitTests before this reserve). So the
/// loop never lets clients take the last <see cref="OpenFiles.Reserve.Size"/> descriptors (an
/// eighth of the limit, at least 64; nginx's workers, with accept_mutex on, stop accepting with an
/// eighth of their connections left): a client accepted into them is closed at once, and accepting
/// waits until a lower descriptor is free. Upstream connections may still use the lower half of them
/// (UpstreamHttpClientFactory); files, threads, the management listener and the demo upstream, which
/// take few connections, all of them.</item>
/// </list>
/// Either is logged once (event 407, naming the limit), then at most every
/// <see cref="RepeatLogEvery"/> while it lasts, and once when accepting works again (408). Clients
/// wait in the kernel's listen backlog meanwhile; open connections are served as before.
/// </summary>
/// <remarks>
/// The connections are Kestrel's own: its public <see cref="SocketConnectionContextFactory"/> makes
/// them from the same options, as Kestrel's listener does, and the listen socket is bound the same
/// way. The factory's options are built with the internal constructor Kestrel itself uses, which
/// also carries Tern's <see cref="BlockPool"/>; the public one would put 4 KB blocks back under
/// every socket. Should a later runtime lack that constructor, <see cref="Available"/> is false and
/// Tern keeps Kestrel's transport (and says so at start).
/// </remarks>
internal sealed class SocketTransport(IOptions<SocketTransportOptions> options, ILoggerFactory loggers, ActiveConfiguration active, IMeterFactory meters) : IConnectionListenerFactory, IConnectionListenerFactorySelector
{
    /// <summary>The meter of <c>tern.listener.accept.errors</c>.</summary>
    public const string MeterName = "Tern.Listeners";

    /// <summary>How long the loop waits after a failed accept before it tries again (nginx: 500 ms).</summary>
    public static readonly TimeSpan RetryDelay = TimeSpan.FromMilliseconds(100);

    /// <summary>The shortest time between two lines about failing accepts on one listener.</summary>
    public static readonly TimeSpan RepeatLogEvery = TimeSpan.FromSeconds(10);

    private static readonly ConstructorInfo? s_factoryOptions = typeof(SocketConnectionFactoryOptions).GetConstructor(
        BindingFlags.NonPublic | BindingFlags.Instance, [typeof(SocketTransportOptions)]);

    private readonly ILogger _logger = loggers.CreateLogger("Tern.Proxy.Listeners");
    private readonly OpenFiles.Reserve _reserve = new();
    private readonly Counter<long> _errors = meters.Create(MeterName).CreateCounter<long>("tern.listener.accept.errors", "{error}",
        "Clients a listener closed because they would have taken the descriptors Tern keeps in reserve (error.type descriptor_reserve), and accept() calls that failed (too_many_open_files, or .NET's SocketError)");

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

        _reserve.Refresh(); // also binds the native calls now: at the limit, loading a library can fail
        _ = LowestFreeDescriptor(socket);
        try
        {
            socket.Listen(transport.Backlog);
            var factoryOptions = (SocketConnectionFactoryOptions)s_factoryOptions!.Invoke([transport]);
            var factory = new SocketConnectionContextFactory(factoryOptions, loggers.CreateLogger("Microsoft.AspNetCore.Server.Kestrel.Transport.Sockets"));
            // The management listener (probes, metrics) and the demo upstream, whose clients are Tern's
            // own upstream connections, take few connections and may use the reserve: /healthz
            // answers while clients wait.
            var settings = active.Bound;
            var port = ((IPEndPoint)endpoint).Port;
            var keepsReserve = port != settings.ManagementPort && !(settings.DemoEnabled && port == settings.DemoPort);
            return new(new Listener(socket, factory, transport.NoDelay, transport.Backlog, keepsReserve ? _reserve : null, _errors, _logger));
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

    /// <summary>The lowest descriptor number free now (what the next accept() would get); int.MaxValue if none is.</summary>
    internal static int LowestFreeDescriptor(Socket socket) => OpenFiles.LowestFree((int)socket.Handle);

    private sealed class Listener(Socket socket, SocketConnectionContextFactory factory, bool noDelay, int backlog, OpenFiles.Reserve? reserve, Counter<long> errors, ILogger logger) : IConnectionListener
    {
        private readonly CancellationTokenSource _unbound = new();
        private readonly string _endpoint = socket.LocalEndPoint?.ToString() ?? "?";

        // Set when the descriptors ran short: accepting waits until one below the reserve is free.
        private bool _waitForDescriptors;

        // Failures since the last line that reported them, when the first of them happened, when
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
                if (_waitForDescriptors)
                {
                    if (!await WaitAsync())
                    {
                        return null;
                    }

                    if (reserve is not null)
                    {
                        reserve.Refresh();
                        if (LowestFreeDescriptor(socket) >= reserve.Floor)
                        {
                            continue;
                        }
                    }

                    _waitForDescriptors = false;
                }

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
                catch (SocketException e) when (e.SocketErrorCode == SocketError.TooManyOpenSockets)
                {
                    // .NET reports EMFILE (the process's limit) and ENFILE (the system's) as one
                    // error, whose message is ENFILE's.
                    Failed("too many open files", "too_many_open_files");
                    _waitForDescriptors = true;
                    continue;
                }
                catch (SocketException e)
                {
                    Failed($"{e.Message} ({e.SocketErrorCode})", e.SocketErrorCode.ToString());
                    if (!await WaitAsync())
                    {
                        return null;
                    }

                    continue;
                }

                if (reserve is not null && (long)accepted.Handle >= reserve.Floor)
                {
                    accepted.Dispose();
                    Failed($"fewer than {reserve.Size} of its {reserve.Limit} descriptors are left, which Tern keeps for upstream connections, files and its own threads; the client it accepted into them was closed", "descriptor_reserve");
                    _waitForDescriptors = true;
                    continue;
                }

                if (_recoveryOwed)
                {
                    Recovered();
                }
                else
                {
                    _failures = 0; // a short spell no line reported
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

        /// <summary>Waits <see cref="RetryDelay"/>; false if the listener was unbound meanwhile.</summary>
        private async Task<bool> WaitAsync()
        {
            try
            {
                await Task.Delay(RetryDelay, _unbound.Token);
                return true;
            }
            catch (OperationCanceledException)
            {
                return false;
            }
        }

        // At most one line about failures every RepeatLogEvery, and one about recovering after each:
        // at the limit, connections that close let a few accepts through, and each would otherwise
        // make a pair of lines.
        private void Failed(string reason, string errorType)
        {
            errors.Add(1, new KeyValuePair<string, object?>("server.port", ((IPEndPoint)EndPoint).Port), new KeyValuePair<string, object?>("error.type", errorType));
            var now = Environment.TickCount64;
            if (_failures++ == 0)
            {
                _firstFailure = now;
            }

            if (_reportedAt != long.MinValue && now - _reportedAt < (long)RepeatLogEvery.TotalMilliseconds)
            {
                return;
            }

            var advice = $"Tern may open {(OpenFiles.Limit() is { } limit ? limit.ToString(CultureInfo.InvariantCulture) : "only so many")} files (RLIMIT_NOFILE; the system's limit is fs.file-max): raise the limit (ulimit -n, systemd's LimitNOFILE, the container runtime's nofile), or cap connections with Kestrel:Limits:MaxConcurrentConnections.";
            if (_failures > 1)
            {
                reason += string.Create(CultureInfo.InvariantCulture, $" ({_failures} times in {(now - _firstFailure) / 1000.0:0.0} s)");
            }

            TernLog.AcceptFailing(logger, _endpoint, reason, backlog, (int)RetryDelay.TotalMilliseconds, advice);
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

        // The token source is not disposed: a loop still between a failure and its wait would
        // then throw instead of returning.
        public ValueTask DisposeAsync()
        {
            _unbound.Cancel();
            socket.Dispose();
            factory.Dispose();
            return default;
        }
    }
}
