using System.Diagnostics;
using System.IO.Pipelines;
using Microsoft.AspNetCore.Connections;
using Microsoft.AspNetCore.Connections.Features;
using Microsoft.AspNetCore.Server.Kestrel.Core;

namespace Tern.Proxy.Listeners;

/// <summary>
/// Before Tern closes a connection whose client may still be sending, it reads and drops what the
/// client sends until the client closes (RFC 9112, 9.6; nginx's lingering close). Closing a socket
/// with input unread makes the kernel reset the connection, and the reset fails the client's next
/// write, or discards what it had not read yet, before it sees the answer Tern wrote last (a 413
/// for an upload over the limit, a TLS alert, the 400 for plain HTTP).
/// </summary>
internal static class LingeringClose
{
    /// <summary>How long the client may stay silent before Tern closes anyway (nginx's lingering_timeout).</summary>
    public static readonly TimeSpan Quiet = TimeSpan.FromSeconds(5);

    /// <summary>How long in all Tern reads a client that keeps sending (nginx's lingering_time).</summary>
    public static readonly TimeSpan Limit = TimeSpan.FromSeconds(30);

    /// <summary>
    /// Reads and drops <paramref name="input"/> until the client closes, stays silent for
    /// <paramref name="quiet"/> (<paramref name="firstQuiet"/> before its first bytes),
    /// <paramref name="limit"/> has passed, or <paramref name="stop"/> fires. Ends without
    /// throwing; the socket is closed after it.
    /// </summary>
    public static async Task DrainAsync(PipeReader input, TimeSpan firstQuiet, TimeSpan quiet, TimeSpan limit, CancellationToken stop = default)
    {
        var started = Stopwatch.GetTimestamp();
        var wait = firstQuiet;
        using var timeout = CancellationTokenSource.CreateLinkedTokenSource(stop);
        try
        {
            while (true)
            {
                var left = limit - Stopwatch.GetElapsedTime(started);
                if (left <= TimeSpan.Zero)
                {
                    return;
                }

                timeout.CancelAfter(left < wait ? left : wait);
                var read = await input.ReadAsync(timeout.Token).ConfigureAwait(false);
                wait = quiet;
                input.AdvanceTo(read.Buffer.End);
                if (read.IsCompleted)
                {
                    return;
                }

                // A cancelled read (the decrypt pump was stopped with CancelPendingRead) reads on.
            }
        }
        catch (Exception ex) when (ex is OperationCanceledException or IOException or ConnectionResetException or InvalidOperationException)
        {
            // Silent too long, out of time, stopping, the client reset, or the input already
            // completed: close anyway.
        }
    }

    /// <summary>
    /// How long a connection of <see cref="UseLingeringClose"/> waits for a first byte: those stacks
    /// cannot tell the client that Tern is done (see there), so an idle client would only be held.
    /// A client still sending has its next bytes there within a round trip.
    /// </summary>
    public static readonly TimeSpan FirstQuiet = TimeSpan.FromSeconds(1);

    /// <summary>
    /// Connection middleware for a connection whose socket Kestrel closes itself (the plain-HTTP
    /// listener; HTTPS on the SslStream engine, placed after the handshake): Kestrel closes the
    /// socket once the middleware after this one returns, and here the client's input is drained
    /// first. Neither stack can tell the client that Tern is done before closing (Kestrel's socket
    /// transport has no half-close, SslStream sends no close_notify), so a client that sends
    /// nothing within <see cref="FirstQuiet"/> is closed then, as an idle one whose keep-alive ran
    /// out. (The OpenSSL engine sends close_notify and lingers in <c>OpenSslConnection</c>.)
    /// </summary>
    public static ListenOptions UseLingeringClose(this ListenOptions listenOptions)
    {
        listenOptions.Use(next => context => RunAsync(context, next));
        return listenOptions;
    }

    /// <summary>Runs <paramref name="next"/> as <see cref="UseLingeringClose"/> does.</summary>
    public static async Task RunAsync(ConnectionContext context, ConnectionDelegate next)
    {
        await next(context).ConfigureAwait(false);
        var input = context.Transport.Input;
        var state = context.ConnectionClosed.IsCancellationRequested ? Input.Ended : Look(input);
        if (state == Input.Ended)
        {
            return;
        }

        var stopping = context.Features.Get<IConnectionLifetimeNotificationFeature>()?.ConnectionClosedRequested ?? default;
        await DrainAsync(input, state == Input.Sending ? Quiet : FirstQuiet, Quiet, Limit, stopping).ConfigureAwait(false);
    }

    private enum Input
    {
        /// <summary>Nothing waits: the client may be idle.</summary>
        Quiet,

        /// <summary>Bytes wait unread: the client is still sending.</summary>
        Sending,

        /// <summary>The client closed, or the input can no longer be read: nothing to drain.</summary>
        Ended,
    }

    /// <summary>
    /// What the client's input holds, without waiting (and drops it). This sees a client that
    /// closed first before Kestrel's ConnectionClosed does (that is raised from the thread pool).
    /// </summary>
    private static Input Look(PipeReader input)
    {
        try
        {
            if (!input.TryRead(out var read))
            {
                return Input.Quiet;
            }

            input.AdvanceTo(read.Buffer.End);
            return read.IsCompleted ? Input.Ended : read.Buffer.IsEmpty ? Input.Quiet : Input.Sending;
        }
        catch (InvalidOperationException)
        {
            return Input.Ended; // completed by Kestrel, or a read left open
        }
    }
}
