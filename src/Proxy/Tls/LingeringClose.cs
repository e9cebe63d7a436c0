using System.Diagnostics;
using System.IO.Pipelines;
using Microsoft.AspNetCore.Connections;

namespace Tern.Proxy.Tls;

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
    /// <paramref name="quiet"/>, <paramref name="limit"/> has passed, or <paramref name="stop"/>
    /// fires. Ends without throwing; the caller then completes the output, which closes the socket.
    /// </summary>
    public static async Task DrainAsync(PipeReader input, TimeSpan quiet, TimeSpan limit, CancellationToken stop = default)
    {
        var started = Stopwatch.GetTimestamp();
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

                timeout.CancelAfter(left < quiet ? left : quiet);
                var read = await input.ReadAsync(timeout.Token).ConfigureAwait(false);
                input.AdvanceTo(read.Buffer.End);
                if (read.IsCompleted)
                {
                    return;
                }

                // A cancelled read (the decrypt pump was stopped with CancelPendingRead) reads on.
            }
        }
        catch (Exception ex) when (ex is OperationCanceledException or IOException or ConnectionResetException)
        {
            // Silent too long, out of time, stopping, or the client reset: close anyway.
        }
    }
}
