using System.Collections.Concurrent;
using System.Diagnostics;
using System.Net.WebSockets;
using System.Text;
using System.Text.Json;
using System.Text.Json.Nodes;

namespace Tern.Tests.Infrastructure;

/// <summary>
/// Headless Chromium (Debian's <c>chromium</c>) driven over its DevTools protocol: a browser's own
/// TLS stack (BoringSSL) and HTTP/1.1, HTTP/2 and WebSocket clients, as users reach Tern.
/// </summary>
public sealed class Browser : IAsyncDisposable
{
    private readonly Process _process;
    private readonly ClientWebSocket _devTools;
    private readonly string _profile;
    private readonly StringBuilder _log;
    private readonly SemaphoreSlim _sending = new(1, 1);
    private readonly ConcurrentDictionary<int, TaskCompletionSource<JsonElement>> _calls = new();
    private readonly Task _receiving;
    private int _lastId;

    /// <summary>How long any one DevTools call may take, unless the caller gives more.</summary>
    private static readonly TimeSpan CallTimeout = TimeSpan.FromSeconds(30);

    private Browser(Process process, ClientWebSocket devTools, string profile, StringBuilder log)
    {
        _process = process;
        _devTools = devTools;
        _profile = profile;
        _log = log;
        _receiving = ReceiveAsync();
    }

    /// <param name="http2">Whether the browser may speak HTTP/2 (else <c>--disable-http2</c>: HTTP/1.1 only).</param>
    public static async Task<Browser> StartAsync(bool http2)
    {
        var profile = Directory.CreateTempSubdirectory("tern-chromium-").FullName;
        var start = new ProcessStartInfo("chromium") { RedirectStandardError = true, UseShellExecute = false };
        // What a headless browser in a closed sandbox needs: no sandbox as root, no GPU, no QUIC (Tern
        // has none), none of the browser's own background traffic, and Tern's test certificates taken.
        string[] args =
        [
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--disable-extensions", "--disable-crash-reporter", "--ignore-certificate-errors",
            $"--user-data-dir={profile}", "--remote-debugging-port=0",
        ];
        foreach (var arg in http2 ? args : [.. args, "--disable-http2"])
        {
            start.ArgumentList.Add(arg);
        }

        start.ArgumentList.Add("about:blank");
        Process process;
        try
        {
            process = Process.Start(start)!;
        }
        catch (System.ComponentModel.Win32Exception e)
        {
            DeleteProfile(profile);
            throw new InvalidOperationException("The browser tests need Chromium as 'chromium' on PATH (Debian: apt-get install chromium).", e);
        }

        var log = new StringBuilder();
        var listening = new TaskCompletionSource<string>(TaskCreationOptions.RunContinuationsAsynchronously);
        const string Banner = "DevTools listening on ";
        process.ErrorDataReceived += (_, e) =>
        {
            if (e.Data is null)
            {
                listening.TrySetException(new InvalidOperationException($"chromium exited before it listened:\n{Snapshot(log)}"));
                return;
            }

            lock (log)
            {
                log.AppendLine(e.Data);
            }

            if (e.Data.StartsWith(Banner, StringComparison.Ordinal))
            {
                listening.TrySetResult(e.Data[Banner.Length..].Trim());
            }
        };
        process.BeginErrorReadLine();
        var devTools = new ClientWebSocket();
        try
        {
            using var connecting = new CancellationTokenSource(CallTimeout);
            await devTools.ConnectAsync(new Uri(await listening.Task.WaitAsync(CallTimeout)), connecting.Token);
        }
        catch
        {
            devTools.Dispose();
            process.Kill(entireProcessTree: true);
            process.WaitForExit(10_000);
            process.Dispose();
            DeleteProfile(profile);
            throw;
        }

        return new Browser(process, devTools, profile, log);
    }

    /// <summary>
    /// Opens <paramref name="url"/> in a new tab, waits for its load event, then evaluates
    /// <paramref name="script"/> there (a promise is awaited) and returns its value.
    /// </summary>
    public async Task<JsonElement> RunAsync(string url, string script, TimeSpan timeout)
    {
        var deadline = DateTime.UtcNow + timeout;
        var target = (await CallAsync("Target.createTarget", new() { ["url"] = "about:blank" })).GetProperty("targetId").GetString()!;
        var session = (await CallAsync("Target.attachToTarget", new() { ["targetId"] = target, ["flatten"] = true })).GetProperty("sessionId").GetString()!;
        // Chromium answers Page.navigate once the new document has committed, so from then on the
        // tab's page is url's; it may still be loading, and a script evaluated in the blank page
        // just before (a race) fails when that page goes, so the wait is tried again.
        var navigated = await CallAsync("Page.navigate", new() { ["url"] = url }, session);
        if (navigated.TryGetProperty("errorText", out var navigationError))
        {
            throw new InvalidOperationException($"Chromium could not open {url}: {navigationError}");
        }

        const string Loaded = "new Promise(done => document.readyState === 'complete' ? done(location.href) : addEventListener('load', () => done(location.href), { once: true }))";
        while (await EvaluateAsync(session, Loaded, deadline - DateTime.UtcNow, retry: true) is not { ValueKind: JsonValueKind.String } page || page.GetString() == "about:blank")
        {
            if (DateTime.UtcNow > deadline)
            {
                throw new TimeoutException($"{url} did not load in {timeout}");
            }

            await Task.Delay(50);
        }

        var value = await EvaluateAsync(session, script, deadline - DateTime.UtcNow, retry: false);
        await CallAsync("Target.closeTarget", new() { ["targetId"] = target });
        return value!.Value;
    }

    /// <summary>The script's value; with retry, null where the page it ran in went away.</summary>
    private async Task<JsonElement?> EvaluateAsync(string session, string script, TimeSpan timeout, bool retry)
    {
        JsonElement evaluated;
        try
        {
            evaluated = await CallAsync("Runtime.evaluate", new() { ["expression"] = script, ["awaitPromise"] = true, ["returnByValue"] = true }, session, timeout);
        }
        catch (InvalidOperationException) when (retry && !_receiving.IsCompleted)
        {
            return null; // "Execution context was destroyed": the page went while the script waited
        }

        if (evaluated.TryGetProperty("exceptionDetails", out var failure))
        {
            var description = failure.TryGetProperty("exception", out var exception) && exception.TryGetProperty("description", out var text) ? text.GetString() : failure.ToString();
            return retry ? null : throw new InvalidOperationException($"The page's script failed: {description}");
        }

        return evaluated.GetProperty("result").GetProperty("value");
    }

    private async Task<JsonElement> CallAsync(string method, JsonObject parameters, string? session = null, TimeSpan? timeout = null)
    {
        var id = Interlocked.Increment(ref _lastId);
        var call = new TaskCompletionSource<JsonElement>(TaskCreationOptions.RunContinuationsAsynchronously);
        _calls[id] = call;
        if (_receiving.IsCompleted)
        {
            _calls.TryRemove(id, out _);
            throw new InvalidOperationException($"Chromium's DevTools connection is closed:\n{Snapshot(_log)}");
        }

        var message = new JsonObject { ["id"] = id, ["method"] = method, ["params"] = parameters };
        if (session is not null)
        {
            message["sessionId"] = session;
        }

        await _sending.WaitAsync();
        try
        {
            await _devTools.SendAsync(Encoding.UTF8.GetBytes(message.ToJsonString()), WebSocketMessageType.Text, true, CancellationToken.None);
        }
        finally
        {
            _sending.Release();
        }

        try
        {
            return await call.Task.WaitAsync(timeout ?? CallTimeout);
        }
        catch (TimeoutException)
        {
            _calls.TryRemove(id, out _);
            throw new TimeoutException($"Chromium did not answer {method} in {timeout ?? CallTimeout}:\n{Snapshot(_log)}");
        }
    }

    private async Task ReceiveAsync()
    {
        var buffer = new byte[64 * 1024];
        using var message = new MemoryStream();
        try
        {
            while (true)
            {
                var received = await _devTools.ReceiveAsync(buffer, CancellationToken.None);
                if (received.MessageType == WebSocketMessageType.Close)
                {
                    return;
                }

                message.Write(buffer, 0, received.Count);
                if (!received.EndOfMessage)
                {
                    continue;
                }

                using var document = JsonDocument.Parse(message.GetBuffer().AsMemory(0, (int)message.Length));
                message.SetLength(0);
                var root = document.RootElement;
                if (root.TryGetProperty("id", out var id) && _calls.TryRemove(id.GetInt32(), out var call))
                {
                    if (root.TryGetProperty("error", out var error))
                    {
                        call.TrySetException(new InvalidOperationException($"DevTools refused a call: {error}"));
                    }
                    else
                    {
                        call.TrySetResult(root.GetProperty("result").Clone());
                    }
                }
            }
        }
        catch (Exception e) when (e is WebSocketException or ObjectDisposedException or OperationCanceledException)
        {
        }
        finally
        {
            foreach (var call in _calls.Values)
            {
                call.TrySetException(new InvalidOperationException($"Chromium's DevTools connection closed:\n{Snapshot(_log)}"));
            }
        }
    }

    private static string Snapshot(StringBuilder log)
    {
        lock (log)
        {
            return log.ToString();
        }
    }

    public async ValueTask DisposeAsync()
    {
        try
        {
            await CallAsync("Browser.close", [], timeout: TimeSpan.FromSeconds(5));
        }
        catch (Exception e) when (e is TimeoutException or InvalidOperationException or WebSocketException)
        {
            // Closed already, or not answering: it is killed below.
        }

        // HasExited, not WaitForExitAsync, which also waits for every helper process holding the
        // browser's stderr to let go of it.
        for (var waited = 0; waited < 100 && !_process.HasExited; waited++)
        {
            await Task.Delay(100);
        }

        try
        {
            _process.Kill(entireProcessTree: true);
        }
        catch (InvalidOperationException)
        {
            // Exited between the check and the kill.
        }

        await _receiving.WaitAsync(TimeSpan.FromSeconds(5)).ContinueWith(_ => { }, TaskScheduler.Default);
        _devTools.Dispose();
        _process.Dispose();
        _sending.Dispose();
        DeleteProfile(_profile);
    }

    private static void DeleteProfile(string profile)
    {
        try
        {
            Directory.Delete(profile, recursive: true);
        }
        catch (IOException)
        {
            // A helper process of the browser still writing as it ends; the folder is temporary.
        }
    }
}
