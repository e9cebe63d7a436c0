using System.Diagnostics;
using System.IO.Pipelines;
using Microsoft.AspNetCore.Connections;
using Microsoft.AspNetCore.Connections.Features;
using Microsoft.AspNetCore.Http;
using Microsoft.AspNetCore.Http.Features;
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
        // The reads take no token: a timeout or the stop cancels the pending read instead. Most
        // often the client has closed already and its end is there without waiting, so the timer
        // is made only for a read that has to wait.
        var started = Stopwatch.GetTimestamp();
        var wait = firstQuiet;
        CancellationTokenSource? timer = null;
        CancellationTokenRegistration timedOut = default, stopped = default;
        try
        {
            while (true)
            {
                var left = limit - Stopwatch.GetElapsedTime(started);
                if (left <= TimeSpan.Zero)
                {
                    return;
                }

                var pending = input.ReadAsync(CancellationToken.None);
                ReadResult read;
                if (pending.IsCompleted)
                {
                    read = pending.Result;
                }
                else
                {
                    if (timer is null)
                    {
                        // The callbacks run on a timer's or the stopping thread. A Pipe's
                        // CancelPendingRead does not throw, completed or not (the socket's pipes
                        // are Pipes).
                        timer = new CancellationTokenSource();
                        timedOut = timer.Token.UnsafeRegister(static reader => ((PipeReader)reader!).CancelPendingRead(), input);
                        stopped = stop.UnsafeRegister(static reader => ((PipeReader)reader!).CancelPendingRead(), input);
                    }

                    timer.CancelAfter(left < wait ? left : wait);
                    read = await pending.ConfigureAwait(false);
                }

                wait = quiet;
                input.AdvanceTo(read.Buffer.End);
                if (read.IsCompleted || (read.IsCanceled && (timer?.IsCancellationRequested == true || stop.IsCancellationRequested)))
                {
                    return;
                }

                // Another cancelled read (the OpenSSL engine's decrypt pump was stopped with
                // CancelPendingRead) reads on.
            }
        }
        catch (Exception)
        {
            // The client reset, or the input was completed or failed: close anyway (lingering is
            // a courtesy; nothing here may fail the connection's end).
        }
        finally
        {
            timedOut.Dispose();
            stopped.Dispose();
            timer?.Dispose();
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
    /// listener; the SslStream engine calls <see cref="AfterAsync"/> once SslStream is done):
    /// Kestrel closes the socket once the middleware after this one returns, and here the client's
    /// input is drained first. Neither stack can tell the client that Tern is done before closing (Kestrel's socket
    /// transport has no half-close, SslStream sends no close_notify), so a client that sends
    /// nothing within <see cref="FirstQuiet"/> is closed then, as an idle one whose keep-alive ran
    /// out. (The OpenSSL engine sends close_notify and lingers in <c>OpenSslConnection</c>.)
    /// </summary>
    public static ListenOptions UseLingeringClose(this ListenOptions listenOptions)
    {
        listenOptions.Use(next => async context =>
        {
            context.Features.Set(new LastRequest());
            await next(context).ConfigureAwait(false);
            await AfterAsync(context).ConfigureAwait(false);
        });
        return listenOptions;
    }

    /// <summary>
    /// What the HTTP layer noted of a connection's last request (<see cref="NoteAsync"/>), on the
    /// connections whose lingering waits <see cref="FirstQuiet"/> for a client that may still send.
    /// </summary>
    internal sealed class LastRequest
    {
        /// <summary>The last request had no body, and Kestrel answered it with Connection: close, as its client asked.</summary>
        public bool ClientDone { get; set; }
    }

    /// <summary>
    /// Notes whether a request leaves its client nothing more to send: no body, and Kestrel closing
    /// the connection after its answer because the client asked it to (HTTP/1.0, or Connection:
    /// close). Such a connection closes as soon as the answer is out, rather than
    /// <see cref="FirstQuiet"/> later: a client that reads its answer to the connection's end (an
    /// HTTP/1.0 client, whose answer without a length ends there) got it a second late. nginx
    /// lingers alike, only where a client may still be sending. Middleware for every request; it
    /// acts on connections with a <see cref="LastRequest"/> (the plain listener's, the SslStream
    /// engine's).
    /// </summary>
    public static Task NoteAsync(HttpContext context, RequestDelegate next)
    {
        // A request kept alive (every one of a load test's) costs a look at its protocol and its
        // Connection header. One that asks to close is confirmed by Kestrel's own word, the
        // Connection: close it answers with, so that a header Kestrel reads otherwise (close
        // beside a tab) never marks a connection that goes on.
        var request = context.Request;
        var connection = request.Headers.Connection;
        if ((HttpProtocol.IsHttp10(request.Protocol) ? !HasToken(connection, "keep-alive") : HttpProtocol.IsHttp11(request.Protocol) && HasToken(connection, "close"))
            && context.Features.Get<IHttpRequestBodyDetectionFeature>()?.CanHaveBody == false
            && context.Features.Get<LastRequest>() is { } last)
        {
            context.Response.OnCompleted(static state =>
            {
                var (response, last) = ((HttpResponse, LastRequest))state;
                last.ClientDone = HasToken(response.Headers.Connection, "close");
                return Task.CompletedTask;
            }, (context.Response, last));
        }

        return next(context);

        static bool HasToken(Microsoft.Extensions.Primitives.StringValues values, string token)
        {
            foreach (var value in values)
            {
                foreach (var part in (value ?? "").Split(','))
                {
                    if (part.Trim(' ').Equals(token, StringComparison.OrdinalIgnoreCase))
                    {
                        return true;
                    }
                }
            }

            return false;
        }
    }

    /// <summary>
    /// Drains the client's input (<c>context.Transport</c>, the socket's pipes) as
    /// <see cref="UseLingeringClose"/> does, once the HTTP layer is done with the connection.
    /// </summary>
    public static async Task AfterAsync(ConnectionContext context)
    {
        var input = context.Transport.Input;
        var state = context.ConnectionClosed.IsCancellationRequested ? Input.Ended : Look(input);
        if (state == Input.Ended || (state == Input.Quiet && context.Features.Get<LastRequest>() is { ClientDone: true }))
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
    /// What the client's input holds, without waiting. This sees a client that closed first before
    /// Kestrel's ConnectionClosed does (that is raised from the thread pool).
    /// </summary>
    private static Input Look(PipeReader input)
    {
        try
        {
            if (!input.TryRead(out var read))
            {
                return Input.Quiet;
            }

            // Left unconsumed: DrainAsync takes it. (Consuming the end of a finished socket pipe
            // here cost a resumed SslStream handshake about 5 µs more, 1.036x its CPU, measured
            // against leaving it; why is not known.)
            input.AdvanceTo(read.Buffer.Start);
            return read.IsCompleted ? Input.Ended : read.Buffer.IsEmpty ? Input.Quiet : Input.Sending;
        }
        catch (Exception)
        {
            // Completed by Kestrel, a read left open, or the client's side failed (a reset): the
            // pipe hands back that error.
            return Input.Ended;
        }
    }
}
