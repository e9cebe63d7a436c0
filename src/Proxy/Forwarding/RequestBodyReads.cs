using System.Buffers;
using System.IO.Pipelines;
using Microsoft.AspNetCore.Http;
using Microsoft.AspNetCore.Http.Features;

namespace Tern.Proxy.Forwarding;

/// <summary>
/// Gives YARP an HTTP/1.x request body whose reads can be cancelled without breaking Kestrel's
/// body reader. YARP cancels its copy of the body when the upstream answers before reading all of
/// it (an HTTP/2 upstream refusing an upload, say) and when a request times out. Kestrel's own body
/// stream passes that cancellation into its reader, which is then left mid-read
/// (dotnet/aspnetcore#17840): Kestrel could not drain the rest of the body, logged an error with a
/// stack trace and left the client's connection without an answer to its next request. Here a
/// cancellation becomes <see cref="PipeReader.CancelPendingRead"/>, whose result is handed back
/// with <see cref="PipeReader.AdvanceTo(SequencePosition)"/>, so the reader stays whole and Kestrel
/// drains the body and keeps the connection as it does for any body an application leaves unread.
/// HTTP/2 bodies are not drained (the stream is reset), so they keep Kestrel's stream.
/// </summary>
internal sealed class RequestBodyReads : Stream
{
    // Runs on whichever thread cancels YARP's token (a timer's, for its activity timeout). Kestrel's
    // reader throws once the request is aborted or over, and a throw there would reach Kestrel's
    // error log, or end the process from a timer; the read then ends with the connection anyway.
    private static readonly Action<object?> s_cancel = static reader =>
    {
        try
        {
            ((PipeReader)reader!).CancelPendingRead();
        }
        catch (Exception)
        {
            // The reader was stopped or aborted: nothing is left to cancel.
        }
    };

    private readonly PipeReader _reader;

    private RequestBodyReads(PipeReader reader) => _reader = reader;

    public static Task InvokeAsync(HttpContext context, RequestDelegate next)
    {
        var request = context.Request;
        if (context.Features.Get<IHttpRequestBodyDetectionFeature>()?.CanHaveBody == true
            && (HttpProtocol.IsHttp11(request.Protocol) || HttpProtocol.IsHttp10(request.Protocol)))
        {
            request.Body = new RequestBodyReads(request.BodyReader);
        }

        return next(context);
    }

    public override bool CanRead => true;

    public override bool CanSeek => false;

    public override bool CanWrite => false;

    public override long Length => throw new NotSupportedException();

    public override long Position
    {
        get => throw new NotSupportedException();
        set => throw new NotSupportedException();
    }

    public override async ValueTask<int> ReadAsync(Memory<byte> destination, CancellationToken cancellationToken = default)
    {
        cancellationToken.ThrowIfCancellationRequested();
        while (true)
        {
            // Most reads find data already there; only one that waits needs to hear of a
            // cancellation (a token already cancelled runs the callback at once: no race).
            var read = _reader.ReadAsync(CancellationToken.None);
            ReadResult result;
            if (read.IsCompleted)
            {
                result = read.Result;
            }
            else
            {
                using (cancellationToken.UnsafeRegister(s_cancel, _reader))
                {
                    result = await read;
                }
            }

            var buffer = result.Buffer;
            if (result.IsCanceled)
            {
                _reader.AdvanceTo(buffer.Start);
                cancellationToken.ThrowIfCancellationRequested();
                continue; // cancelled for a token no longer ours: read again
            }

            if (destination.IsEmpty)
            {
                // A zero-byte read waits for data without taking any (YARP's copier issues one
                // before it rents a buffer).
                _reader.AdvanceTo(buffer.Start);
                return 0;
            }

            if (buffer.IsEmpty && !result.IsCompleted)
            {
                _reader.AdvanceTo(buffer.Start, buffer.End);
                continue;
            }

            var length = (int)Math.Min(buffer.Length, destination.Length);
            var taken = buffer.Slice(0, length);
            taken.CopyTo(destination.Span);
            _reader.AdvanceTo(taken.End);
            return length;
        }
    }

    public override Task<int> ReadAsync(byte[] buffer, int offset, int count, CancellationToken cancellationToken) =>
        ReadAsync(buffer.AsMemory(offset, count), cancellationToken).AsTask();

    // Kestrel refuses synchronous reads of a request body unless AllowSynchronousIO is set, which Tern never sets.
    public override int Read(byte[] buffer, int offset, int count) => throw new NotSupportedException("Synchronous reads of the request body are not supported.");

    public override void Flush()
    {
    }

    public override long Seek(long offset, SeekOrigin origin) => throw new NotSupportedException();

    public override void SetLength(long value) => throw new NotSupportedException();

    public override void Write(byte[] buffer, int offset, int count) => throw new NotSupportedException();
}
