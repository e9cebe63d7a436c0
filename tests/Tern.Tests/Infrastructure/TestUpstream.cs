using System.Net;
using System.Net.WebSockets;
using System.Text.Json;
using Microsoft.AspNetCore.Hosting.Server;
using Microsoft.AspNetCore.Hosting.Server.Features;

namespace Tern.Tests.Infrastructure;

/// <summary>A real Kestrel app on 127.0.0.1 that the proxy forwards to.</summary>
public sealed class TestUpstream : IAsyncDisposable
{
    private readonly WebApplication _app;
    private int _requests;

    private TestUpstream(WebApplication app, string name)
    {
        _app = app;
        Name = name;
    }

    public string Name { get; }

    public Uri Address { get; private set; } = null!;

    public int Requests => Volatile.Read(ref _requests);

    /// <summary>Completing this lets every /hold download send its second half.</summary>
    public TaskCompletionSource Release { get; } = new(TaskCreationOptions.RunContinuationsAsynchronously);

    /// <summary>A deterministic byte pattern, so that any corruption or reordering shows.</summary>
    public static byte[] Pattern(int length)
    {
        var bytes = new byte[length];
        for (var i = 0; i < length; i++)
        {
            bytes[i] = (byte)((i * 31) + (i >> 13) + 7);
        }

        return bytes;
    }

    /// <param name="name">What /name answers.</param>
    /// <param name="http2">Speak HTTP/2 without TLS (prior knowledge, as YARP's h2c clusters do) instead of HTTP/1.1.</param>
    public static async Task<TestUpstream> StartAsync(string name = "up", bool http2 = false)
    {
        var builder = WebApplication.CreateSlimBuilder();
        builder.Logging.ClearProviders();
        builder.WebHost.UseKestrel(k =>
        {
            k.Listen(IPAddress.Loopback, 0, l => l.Protocols = http2 ? Microsoft.AspNetCore.Server.Kestrel.Core.HttpProtocols.Http2 : l.Protocols);
            k.Limits.MaxRequestBodySize = null;
        });
        var app = builder.Build();
        var upstream = new TestUpstream(app, name);
        app.UseWebSockets();
        app.Use((context, next) =>
        {
            Interlocked.Increment(ref upstream._requests);
            context.Response.Headers["X-Upstream"] = name;
            return next(context);
        });

        // Response body = request body, byte for byte; says how the body arrived. The body is read
        // whole before answering, as applications do: over HTTP/1.1 the forwarder's client sends the
        // entire request before it reads a response, so a streaming echo would stall on large bodies.
        app.Map("/echo", async context =>
        {
            context.Response.Headers["X-Received-Chunked"] = context.Request.Headers.TransferEncoding.ToString().Contains("chunked", StringComparison.OrdinalIgnoreCase) ? "true" : "false";
            var received = new MemoryStream();
            await context.Request.Body.CopyToAsync(received, context.RequestAborted);
            context.Response.ContentLength = received.Length;
            await context.Response.Body.WriteAsync(received.GetBuffer().AsMemory(0, (int)received.Length), context.RequestAborted);
        });
        // Shaped like a gRPC duplex call (HTTP/2 only): each piece of the request body is echoed and
        // flushed as it arrives, and the answer ends with trailers, as grpc-status is sent.
        app.MapPost("/duplex", async context =>
        {
            context.Response.ContentType = "application/grpc";
            await context.Response.StartAsync(context.RequestAborted);
            var buffer = new byte[64 * 1024];
            int read;
            long total = 0;
            while ((read = await context.Request.Body.ReadAsync(buffer, context.RequestAborted)) > 0)
            {
                total += read;
                await context.Response.Body.WriteAsync(buffer.AsMemory(0, read), context.RequestAborted);
                await context.Response.Body.FlushAsync(context.RequestAborted);
            }

            context.Response.AppendTrailer("grpc-status", "0");
            context.Response.AppendTrailer("x-received", total.ToString(System.Globalization.CultureInfo.InvariantCulture));
        });
        // Answers at once (or after ?delay= milliseconds), 100 KB in chunks of 10 KB, without reading the request body.
        app.MapPost("/early", async context =>
        {
            if (int.TryParse(context.Request.Query["delay"], out var delay))
            {
                await Task.Delay(delay, context.RequestAborted);
            }

            for (var i = 0; i < 10; i++)
            {
                await context.Response.Body.WriteAsync(Pattern(10 * 1024), context.RequestAborted);
                await context.Response.Body.FlushAsync(context.RequestAborted);
            }
        });
        // Refuses the upload at once, without content and without reading the request body.
        app.MapPost("/early-empty", context =>
        {
            context.Response.StatusCode = StatusCodes.Status401Unauthorized;
            context.Response.ContentLength = 0;
            return Task.CompletedTask;
        });
        // HTTP/2 only: 10 KB of a response, then (200 ms later) the stream reset with INTERNAL_ERROR.
        app.MapGet("/reset-mid-body", async context =>
        {
            await context.Response.Body.WriteAsync(Pattern(10 * 1024), context.RequestAborted);
            await context.Response.Body.FlushAsync(context.RequestAborted);
            await Task.Delay(200, context.RequestAborted); // the 10 KB reach the client first
            context.Features.Get<Microsoft.AspNetCore.Http.Features.IHttpResetFeature>()!.Reset(0x2);
        });
        app.MapGet("/bytes/{length:int}", (int length) => Results.Bytes(Pattern(length), "application/octet-stream"));
        app.MapGet("/headers", (HttpContext context) => Results.Json(context.Request.Headers.ToDictionary(h => h.Key, h => h.Value.ToString())));
        app.MapGet("/name", () => name);
        // A redirect to ?to=, as given (an absolute URL at the upstream's own address, say), and a
        // page that sends the client on with a Refresh header, ?value= as given; under /v2 too, for
        // routes that add that prefix.
        foreach (var under in new[] { "", "/v2" })
        {
            app.MapGet(under + "/redirect", (HttpContext context) =>
            {
                context.Response.StatusCode = StatusCodes.Status302Found;
                context.Response.Headers.Location = context.Request.Query["to"];
            });
            app.MapGet(under + "/refresh", (HttpContext context) => context.Response.Headers["Refresh"] = context.Request.Query["value"]);
        }

        app.MapGet("/slow/{milliseconds:int}", async (int milliseconds, HttpContext context) =>
        {
            await Task.Delay(milliseconds, context.RequestAborted);
            return "slow done";
        });

        // A long download: count chunks of 64 KB, one every delay milliseconds.
        app.MapGet("/stream/{count:int}/{delay:int}", async (int count, int delay, HttpContext context) =>
        {
            var chunk = Pattern(64 * 1024);
            context.Response.ContentLength = (long)count * chunk.Length;
            for (var i = 0; i < count; i++)
            {
                await context.Response.Body.WriteAsync(chunk, context.RequestAborted);
                await context.Response.Body.FlushAsync(context.RequestAborted);
                await Task.Delay(delay, context.RequestAborted);
            }
        });
        // Half of count chunks of 64 KB, then waits for Release, then the other half.
        app.MapGet("/hold/{count:int}", async (int count, HttpContext context) =>
        {
            var chunk = Pattern(64 * 1024);
            context.Response.ContentLength = (long)count * chunk.Length;
            for (var i = 0; i < count; i++)
            {
                if (i == count / 2)
                {
                    await upstream.Release.Task.WaitAsync(context.RequestAborted);
                }

                await context.Response.Body.WriteAsync(chunk, context.RequestAborted);
                await context.Response.Body.FlushAsync(context.RequestAborted);
            }
        });
        app.Map("/ws", async context =>
        {
            if (!context.WebSockets.IsWebSocketRequest)
            {
                context.Response.StatusCode = 400;
                return;
            }

            using var socket = await context.WebSockets.AcceptWebSocketAsync();
            var buffer = new byte[64 * 1024];
            while (true)
            {
                var result = await socket.ReceiveAsync(buffer, context.RequestAborted);
                if (result.MessageType == WebSocketMessageType.Close)
                {
                    await socket.CloseAsync(WebSocketCloseStatus.NormalClosure, "bye", context.RequestAborted);
                    return;
                }

                await socket.SendAsync(buffer.AsMemory(0, result.Count), result.MessageType, result.EndOfMessage, context.RequestAborted);
            }
        });

        await app.StartAsync();
        var address = app.Services.GetRequiredService<IServer>().Features.Get<IServerAddressesFeature>()!.Addresses.Single();
        upstream.Address = new Uri(address.Replace("[::]", "127.0.0.1", StringComparison.Ordinal) + "/");
        return upstream;
    }

    public static Dictionary<string, string> ParseHeaders(string json) =>
        JsonSerializer.Deserialize<Dictionary<string, string>>(json)!.ToDictionary(p => p.Key, p => p.Value, StringComparer.OrdinalIgnoreCase);

    public async ValueTask DisposeAsync()
    {
        await _app.StopAsync();
        await _app.DisposeAsync();
    }
}
