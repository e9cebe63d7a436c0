using System.Buffers;

namespace Tern.Proxy.Tls.OpenSsl;

internal sealed partial class OpenSslConnection
{
    /// <summary>
    /// Runs the handshake over the transport. Returns null when it completed, else a short reason
    /// ("timeout", "closed", "plain_http", "protocol: ...") for metrics and logs. Ciphertext that
    /// arrives after the client's Finished stays in the transport pipe for the decrypt pump.
    /// </summary>
    public async Task<string?> HandshakeAsync(CancellationToken cancellationToken)
    {
        try
        {
            var firstBytes = NotTls.FirstBytes.Unknown;
            while (true)
            {
                var read = await _transport.Input.ReadAsync(cancellationToken).ConfigureAwait(false);
                var buffer = read.Buffer;
                if (firstBytes == NotTls.FirstBytes.Unknown && (firstBytes = NotTls.Classify(buffer)) != NotTls.FirstBytes.Other)
                {
                    // Plain HTTP gets a 400 (OpenSSL would close without a word); the start of a
                    // method name waits for the rest, without OpenSSL seeing it yet.
                    if (firstBytes == NotTls.FirstBytes.PlainHttp)
                    {
                        _transport.Input.AdvanceTo(buffer.End);
                        return NotTls.PlainHttpFailure;
                    }

                    _transport.Input.AdvanceTo(buffer.Start, buffer.End);
                    if (read.IsCompleted || read.IsCanceled)
                    {
                        return "closed";
                    }

                    continue;
                }

                var (status, consumed) = HandshakeStep(buffer);
                var position = buffer.GetPosition(consumed);

                // Once the handshake is done, bytes after the client's Finished (often its first
                // request, in the same segment) are not examined: the decrypt pump must see them
                // without waiting for more to arrive.
                _transport.Input.AdvanceTo(position, status == Interop.Ok ? position : buffer.End);
                await _transport.Output.FlushAsync(cancellationToken).ConfigureAwait(false);
                switch (status)
                {
                    case Interop.Ok:
                        ReadNegotiatedParameters();
                        return null;
                    case Interop.WantRead when !read.IsCompleted && !read.IsCanceled:
                        continue;
                    case Interop.WantRead:
                        return "closed";
                    default:
                        ClientCertificateRefused = Interop.ConnectionClientCertificateRefused(_handle) == 1;
                        return $"protocol: {FailureReason}";
                }
            }
        }
        catch (OperationCanceledException)
        {
            return "timeout";
        }
        catch (Exception ex) when (ex is IOException or System.Net.Sockets.SocketException or Microsoft.AspNetCore.Connections.ConnectionResetException)
        {
            return "closed";
        }
    }

    /// <summary>Whether the handshake failed because of the client's certificate (Tern:Https:ClientCertificates).</summary>
    public bool ClientCertificateRefused { get; private set; }

    /// <summary>Feeds what has arrived to OpenSSL, segment by segment; writes its records to the transport.</summary>
    private (int Status, long Consumed) HandshakeStep(ReadOnlySequence<byte> buffer)
    {
        var status = Interop.WantRead;
        long consumed = 0;
        long direct = 0;
        foreach (var segment in buffer)
        {
            var offset = 0;
            do
            {
                var window = _transport.Output.GetMemory();
                var call = Native(Operation.Handshake, segment.Span[offset..], window.Span);
                _transport.Output.Advance(call.Produced);
                direct += call.Direct;
                offset += call.Consumed;
                status = call.Status;
                DrainSpill(call.Pending);
                if (status != Interop.WantRead || call.Consumed == 0)
                {
                    break;
                }
            }
            while (offset < segment.Length);

            consumed += offset;
            if (status != Interop.WantRead)
            {
                break;
            }
        }

        _metrics.Direct(TlsMetrics.Direction.Handshake, direct);
        return (status, consumed);
    }

    private enum Operation
    {
        Handshake,
        Decrypt,
        Encrypt,
        Shutdown,
    }

    /// <summary>What one native call did.</summary>
    private readonly record struct Call(Interop.Result Result)
    {
        public int Status => Result.Status;

        public int Consumed => Result.Consumed;

        public int Produced => Result.Produced;

        public int Pending => Result.Pending;

        /// <summary>Output bytes written straight into the window, not taken from the spill buffer.</summary>
        public int Direct => Result.Produced - Result.Drained;
    }

    /// <summary>
    /// One native call with the windows pinned for its duration only, under the connection's lock.
    /// Every spilled byte is counted here, once, as it enters the spill buffer.
    /// </summary>
    private unsafe Call Native(Operation operation, ReadOnlySpan<byte> input, Span<byte> output)
    {
        Interop.Result result;
        lock (_native)
        {
            fixed (byte* inputPointer = input)
            fixed (byte* outputPointer = output)
            {
                _ = operation switch
                {
                    Operation.Handshake => Interop.Handshake(_ssl, inputPointer, input.Length, outputPointer, output.Length, out result),
                    Operation.Decrypt => Interop.Decrypt(_ssl, inputPointer, input.Length, outputPointer, output.Length, out result),
                    Operation.Encrypt => Interop.Encrypt(_ssl, inputPointer, input.Length, outputPointer, output.Length, out result),
                    _ => Interop.Shutdown(_ssl, outputPointer, output.Length, out result),
                };
            }

            _pending = result.Pending;
            if (result.Status == Interop.Error && _firstFailure is null)
            {
                // Under the lock: the pump that fails the connection is the one whose operation
                // failed first, not whichever catches its exception first, and the reason is read
                // before the other pump's call can overwrite it.
                _firstFailure = operation;
                _failureReason = Interop.ConnectionErrorText(_handle);
            }
        }

        if (result.Spilled > 0)
        {
            // Encrypt spills payload; the others only control records (handshake, alerts, close_notify).
            var direction = operation switch
            {
                Operation.Encrypt => TlsMetrics.Direction.Encrypt,
                Operation.Decrypt => TlsMetrics.Direction.Decrypt,
                Operation.Shutdown => TlsMetrics.Direction.Shutdown,
                _ => TlsMetrics.Direction.Handshake,
            };
            _metrics.Spilled(direction, result.Spilled);
        }

        return new Call(result);
    }

    /// <summary>
    /// Whether the first TLS error of this connection came from one of operations, or none came
    /// from OpenSSL (the pump's own check failed): that pump counts and reports it. The other pump
    /// then fails too (OpenSSL refuses an SSL object after a fatal error), and is neither a second
    /// error nor a second reason.
    /// </summary>
    private bool FailedFirst(params ReadOnlySpan<Operation> operations)
    {
        lock (_native)
        {
            return _firstFailure is not { } first || operations.Contains(first);
        }
    }

    /// <summary>OpenSSL's reason for the connection's first TLS error.</summary>
    private string FailureReason
    {
        get
        {
            lock (_native)
            {
                return _failureReason ?? "unknown";
            }
        }
    }

    /// <summary>Moves spilled bytes into the transport pipe (only the pipe's writer may call this).</summary>
    private void DrainSpill(int pending)
    {
        while (pending > 0)
        {
            var window = _transport.Output.GetMemory(pending);
            var call = Native(Operation.Encrypt, default, window.Span);
            _transport.Output.Advance(call.Produced);
            pending = call.Pending;
        }
    }
}
