using System.Buffers.Binary;
using System.Text;

namespace Tern.Tests.Infrastructure;

/// <summary>
/// HTTP/2 frames written by hand, for what .NET's HttpClient will not send: any byte in a header,
/// streams reset as soon as they open. Header blocks are HPACK literals, never indexed or
/// Huffman-coded, so every byte goes through as it is.
/// </summary>
public static class Http2Frames
{
    public const byte Data = 0, Headers = 1, RstStream = 3, Settings = 4, GoAway = 7;

    public const byte EndStream = 0x1, EndHeaders = 0x4;

    /// <summary>The client's connection preface and an empty SETTINGS frame.</summary>
    public static void WritePreface(Stream output)
    {
        output.Write("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"u8);
        WriteFrame(output, Settings, 0, 0, []);
    }

    public static byte[] HeaderBlock(IEnumerable<(string Name, string Value)> headers)
    {
        var block = new MemoryStream();
        foreach (var (name, value) in headers)
        {
            block.WriteByte(0); // literal header field without indexing, new name
            WriteString(block, name);
            WriteString(block, value);
        }

        return block.ToArray();
    }

    public static void WriteFrame(Stream output, byte type, byte flags, int streamId, ReadOnlySpan<byte> payload)
    {
        Span<byte> head = stackalloc byte[9];
        head[0] = (byte)(payload.Length >> 16);
        head[1] = (byte)(payload.Length >> 8);
        head[2] = (byte)payload.Length;
        head[3] = type;
        head[4] = flags;
        BinaryPrimitives.WriteInt32BigEndian(head[5..], streamId);
        output.Write(head);
        output.Write(payload);
    }

    /// <summary>The next frame's type, stream and payload; null when the connection ends.</summary>
    public static async Task<(byte Type, int StreamId, byte[] Payload)?> ReadFrameAsync(Stream stream, CancellationToken cancellationToken)
    {
        var head = new byte[9];
        try
        {
            await stream.ReadExactlyAsync(head, cancellationToken);
        }
        catch (EndOfStreamException)
        {
            return null;
        }

        var payload = new byte[(head[0] << 16) | (head[1] << 8) | head[2]];
        await stream.ReadExactlyAsync(payload, cancellationToken);
        return (head[3], BinaryPrimitives.ReadInt32BigEndian(head.AsSpan(5)) & 0x7fffffff, payload);
    }

    private static void WriteString(Stream block, string text)
    {
        var bytes = Encoding.Latin1.GetBytes(text);
        var length = bytes.Length; // HPACK integer, 7-bit prefix, H = 0
        if (length < 127)
        {
            block.WriteByte((byte)length);
        }
        else
        {
            block.WriteByte(127);
            for (length -= 127; length >= 128; length >>= 7)
            {
                block.WriteByte((byte)((length & 0x7f) | 0x80));
            }

            block.WriteByte((byte)length);
        }

        block.Write(bytes);
    }
}
