using System.Buffers;
using System.IO.Pipelines;
using System.Text;
using Microsoft.AspNetCore.Connections;
using Microsoft.Extensions.Logging;
using Tern.Proxy.Listeners;

namespace Tern.Proxy.Tls;

/// <summary>
/// What the HTTPS listener does with a client that does not speak TLS. A request sent as plain
/// HTTP (http:// to the HTTPS port, a health check set up without TLS) is answered with a 400 that
/// says so, as nginx does, rather than an empty reply; anything else is closed. Both engines use it.
/// </summary>
internal static class NotTls
{
    /// <summary>The first byte of a TLS handshake record.</summary>
    public const byte HandshakeRecord = 0x16;

    /// <summary>The handshake failure (and error.type) of a plain-HTTP request.</summary>
    public const string PlainHttpFailure = "plain_http";

    /// <summary>
    /// How long the client may take to close after the answer (see <see cref="CloseAfterAsync"/>),
    /// at most: never past the handshake's deadline, which bounds how long any client that has
    /// not completed a handshake holds a connection.
    /// </summary>
    public static readonly TimeSpan Linger = TimeSpan.FromSeconds(2);

    private static readonly byte[] s_answer = Answer();

    /// <summary>What a client's first bytes say it speaks.</summary>
    public enum FirstBytes
    {
        /// <summary>Not yet known: upper-case letters so far, a method name that may go on.</summary>
        Unknown,

        /// <summary>An HTTP request line: a method of 3 or more upper-case letters and a space ("GET ", "CONNECT ").</summary>
        PlainHttp,

        /// <summary>Anything else: TLS (a handshake record, 0x16), or bytes neither TLS nor HTTP.</summary>
        Other,
    }

    /// <summary>
    /// Classifies the client's first bytes. A TLS client is known at its first byte (0x16, never
    /// a letter), so this costs a handshake one comparison; bytes that could still begin a method
    /// name are <see cref="FirstBytes.Unknown"/> until a space or another byte decides, or 16 of
    /// them have come.
    /// </summary>
    public static FirstBytes Classify(ReadOnlySequence<byte> start)
    {
        Span<byte> head = stackalloc byte[16];
        var length = (int)Math.Min(start.Length, head.Length);
        start.Slice(0, length).CopyTo(head);
        for (var i = 0; i < length; i++)
        {
            if (head[i] == (byte)' ' && i >= 3)
            {
                return FirstBytes.PlainHttp;
            }

            if (head[i] is < (byte)'A' or > (byte)'Z')
            {
                return FirstBytes.Other;
            }
        }

        return length < head.Length ? FirstBytes.Unknown : FirstBytes.Other;
    }

    /// <summary>Logs a plain-HTTP request on the TLS port as a failed handshake, answers it with a 400 and closes.</summary>
    public static async Task AnswerPlainHttpAsync(ConnectionContext context, ILogger logger, TimeSpan handshakeTimeLeft)
    {
        TernLog.HandshakeFailed(logger, context.ConnectionId, context.RemoteEndPoint?.ToString() ?? "-", "a plain HTTP request on the HTTPS port (answered 400)");
        await context.Transport.Output.WriteAsync(s_answer);
        await CloseAfterAsync(context.Transport, handshakeTimeLeft);
    }

    /// <summary>
    /// Closes after what was written (a 400, a TLS alert) has had a chance to reach the client (a
    /// <see cref="LingeringClose"/>), for at most <see cref="Linger"/> and not past the handshake's
    /// deadline.
    /// </summary>
    public static async Task CloseAfterAsync(IDuplexPipe transport, TimeSpan handshakeTimeLeft)
    {
        var linger = handshakeTimeLeft < Linger ? TimeSpan.FromTicks(Math.Max(0, handshakeTimeLeft.Ticks)) : Linger;
        await LingeringClose.DrainAsync(transport.Input, linger, linger, linger);
        await transport.Output.CompleteAsync();
    }

    private static byte[] Answer()
    {
        const string body = "400 Bad Request: this port speaks HTTPS, and the request came as plain HTTP; use https://\n";
        return Encoding.ASCII.GetBytes(
            "HTTP/1.1 400 Bad Request\r\n" +
            "Content-Type: text/plain; charset=utf-8\r\n" +
            $"Content-Length: {body.Length}\r\n" +
            "Cache-Control: no-store\r\n" +
            "Connection: close\r\n\r\n" + body);
    }
}
