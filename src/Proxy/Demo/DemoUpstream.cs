using System.Text;
using System.Text.Json;
using Microsoft.AspNetCore.Http;

namespace Tern.Proxy.Demo;

/// <summary>
/// The embedded demo upstream (Tern:Demo:Enabled): echoes the method, path, headers and body it
/// received as JSON, on 127.0.0.1 only, so a fresh install shows a request crossing TLS and YARP.
/// </summary>
internal static class DemoUpstream
{
    private const int MaxEchoedBody = 64 * 1024;

    public static async Task HandleAsync(HttpContext context)
    {
        var request = context.Request;
        var body = new MemoryStream();
        var buffer = new byte[16 * 1024];
        long total = 0;
        int read;
        try
        {
            while ((read = await request.Body.ReadAsync(buffer, context.RequestAborted)) > 0)
            {
                total += read;
                var keep = (int)Math.Min(read, MaxEchoedBody - body.Length);
                body.Write(buffer, 0, Math.Max(keep, 0));
            }
        }
        catch (BadHttpRequestException refused)
        {
            // A body Kestrel refuses (over its 30 MB limit, say), answered as an application
            // should: left unhandled, it was an error with a stack trace in Tern's log.
            context.Response.StatusCode = refused.StatusCode;
            context.Response.ContentType = "text/plain; charset=utf-8";
            await context.Response.WriteAsync($"{refused.StatusCode}: {refused.Message}\n");
            return;
        }

        var echo = new Dictionary<string, object?>
        {
            ["server"] = "tern-demo",
            ["method"] = request.Method,
            ["path"] = request.Path.Value,
            ["query"] = request.QueryString.Value,
            ["protocol"] = request.Protocol,
            ["headers"] = request.Headers.ToDictionary(h => h.Key, h => AsUtf8(h.Value.ToString())),
            ["bodyLength"] = total,
            ["body"] = Encoding.UTF8.GetString(body.GetBuffer(), 0, (int)body.Length),
        };
        context.Response.ContentType = "application/json; charset=utf-8";
        await JsonSerializer.SerializeAsync(context.Response.Body, echo, s_json, context.RequestAborted);
        await context.Response.WriteAsync("\n");
    }

    /// <summary>
    /// A header's bytes read as UTF-8 for the echo: Kestrel hands them over one character per byte
    /// (Forwarding.HeaderBytes), so a browser's "café" would show as "cafÃ©".
    /// </summary>
    private static string AsUtf8(string value) =>
        Ascii.IsValid(value) ? value : Encoding.UTF8.GetString(Encoding.Latin1.GetBytes(value));

    private static readonly JsonSerializerOptions s_json = new() { WriteIndented = true };
}
