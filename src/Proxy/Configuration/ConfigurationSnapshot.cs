using System.Globalization;
using System.Reflection;
using Microsoft.Extensions.Configuration;
using Microsoft.Extensions.Logging;
using Microsoft.Extensions.Logging.Console;
using Tern.Proxy.Tls;

namespace Tern.Proxy.Configuration;

/// <summary>
/// One fully checked configuration: Tern's settings, the loaded certificates and the
/// ReverseProxy section to hand to YARP. Built at start and on every reload; never partial.
/// </summary>
public sealed record ConfigurationSnapshot(
    TernSettings Settings,
    CertificateSet Certificates,
    bool SelfSigned,
    IReadOnlyList<KeyValuePair<string, string?>> ReverseProxy,
    IReadOnlyList<string> UnknownKeys)
{
    /// <summary>Session ticket keys from Tern:Tls:SessionTicketKeys (empty: per-process random keys).</summary>
    public ReadOnlyMemory<byte> SessionTicketKeys { get; init; }

    /// <summary>The Logging section (levels, console options), handed to .NET's logging through a <see cref="ConfigurationGate"/>.</summary>
    public IReadOnlyList<KeyValuePair<string, string?>> Logging { get; init; } = [];

    /// <summary>The client certificates (mTLS) the HTTPS listener accepts.</summary>
    public ClientCertificateTrust ClientCertificates { get; init; } = ClientCertificateTrust.None;

    /// <summary>Size of one session ticket key: 16 bytes name, 32 AES-256 key, 32 HMAC-SHA256 key.</summary>
    public const int SessionTicketKeySize = 80;

    /// <summary>Reads and checks everything; on failure returns null and every problem found.</summary>
    internal static ConfigurationSnapshot? TryLoad(IConfiguration configuration, out IReadOnlyList<ConfigurationProblem> problems)
    {
        var reader = new SettingReader(configuration);
        reader.Problems.AddRange(CheckedJsonFile.Problems(configuration));
        var settings = TernSettings.Read(reader) with { ListenerLimits = Listeners.ListenerLimits.Read(configuration, reader.Problems) };
        var reverseProxy = Values(configuration, ReverseProxyValidator.Section);
        ReverseProxyValidator.Validate(configuration, reverseProxy, reader.Problems);
        CheckLogLevels(configuration, reader.Problems);
        CheckConsoleOptions(configuration, reader.Problems);

        var selfSigned = settings.Certificates.Count == 0;
        var certificates = LoadCertificates(settings, selfSigned, reader.Problems);
        var ticketKeys = LoadTicketKeys(settings.SessionTicketKeysPath, reader.Problems);
        var clientCertificates = ClientCertificateTrust.Load(settings, reader.Problems);

        problems = reader.Problems;
        if (problems.Count > 0 || certificates is null)
        {
            return null;
        }

        return new ConfigurationSnapshot(settings, certificates, selfSigned, reverseProxy, [.. reader.UnreadKeys(TernSettings.Section), .. Listeners.ListenerLimits.IgnoredKeys(configuration)])
        {
            Logging = Values(configuration, LoggingSection),
            SessionTicketKeys = ticketKeys,
            ClientCertificates = clientCertificates,
        };
    }

    public const string LoggingSection = "Logging";

    private static List<KeyValuePair<string, string?>> Values(IConfiguration configuration, string section) =>
        configuration.GetSection(section).AsEnumerable().Where(pair => pair.Value is not null).ToList();

    /// <summary>
    /// Every value under Logging:LogLevel and Logging:{provider}:LogLevel, at any depth
    /// (Logging__LogLevel__Microsoft__AspNetCore is Logging:LogLevel:Microsoft:AspNetCore), parsed
    /// as .NET's logger filter parses them: a value it cannot parse throws inside the logging
    /// system, at start (where it used to be reported as a ReverseProxy problem) and on every reload.
    /// </summary>
    private static void CheckLogLevels(IConfiguration configuration, List<ConfigurationProblem> problems)
    {
        var logging = configuration.GetSection(LoggingSection);
        var levels = logging.GetChildren().Select(c => c.Key.Equals("LogLevel", StringComparison.OrdinalIgnoreCase) ? c : c.GetSection("LogLevel"));
        foreach (var section in levels)
        {
            foreach (var (key, value) in section.AsEnumerable())
            {
                if (string.IsNullOrEmpty(value))
                {
                    continue;
                }

                if (key == section.Path)
                {
                    // Logging__LogLevel=Warning: .NET reads categories under it and would ignore this.
                    problems.Add(new(key, $"'{value}' is given to the section itself, which .NET ignores; name a category: {key}:Default={value}"));
                }
                else if (!Enum.TryParse<LogLevel>(value, ignoreCase: true, out _))
                {
                    problems.Add(new(key, $"'{value}' is not a log level; use Trace, Debug, Information, Warning, Error, Critical or None"));
                }
            }
        }
    }

    /// <summary>The console log formats .NET's console logger has (AddConsole registers these three).</summary>
    private static readonly string[] ConsoleFormats = ["simple", "json", "systemd"];

    /// <summary>
    /// Logging:Console (ConsoleLoggerOptions) and Logging:Console:FormatterOptions (which every
    /// format binds), value by value, bound as .NET binds them: a value it cannot convert or
    /// refuses (QueueFullMode=Drop, MaxQueueLength=0) throws inside the logging system, which at
    /// start was reported as a ReverseProxy problem or ended the process with a stack trace, and
    /// a timestamp format .NET cannot format with threw at the first line written. An unknown
    /// format name would be replaced by simple without a word.
    /// </summary>
    private static void CheckConsoleOptions(IConfiguration configuration, List<ConfigurationProblem> problems)
    {
        var console = configuration.GetSection(LoggingSection).GetSection("Console");
        foreach (var (key, value) in console.AsEnumerable(makePathsRelative: true))
        {
            if (value is null || key.StartsWith("LogLevel", StringComparison.OrdinalIgnoreCase))
            {
                continue;
            }

            const string Formatter = "FormatterOptions:";
            var formatter = key.StartsWith(Formatter, StringComparison.OrdinalIgnoreCase);
            var option = formatter ? key[Formatter.Length..] : key;
            var problem = (formatter ? [typeof(SimpleConsoleFormatterOptions), typeof(JsonConsoleFormatterOptions)] : new[] { typeof(ConsoleLoggerOptions) })
                .Select(type => ConsoleOptionProblem(type, option, value)).FirstOrDefault(p => p is not null);
            if (problem is null && option.Equals(nameof(ConsoleLoggerOptions.FormatterName), StringComparison.OrdinalIgnoreCase) && !formatter
                && value.Length > 0 && !ConsoleFormats.Contains(value, StringComparer.OrdinalIgnoreCase))
            {
                problem = "is not a console log format; use simple, json or systemd";
            }

            if (problem is null && option.Equals(nameof(ConsoleFormatterOptions.TimestampFormat), StringComparison.OrdinalIgnoreCase) && value.Length > 0)
            {
                try
                {
                    _ = DateTimeOffset.UnixEpoch.ToString(value, CultureInfo.CurrentCulture); // as the formatters write it
                }
                catch (FormatException)
                {
                    problem = "is not a .NET date and time format (e.g. yyyy-MM-ddTHH:mm:ss.fffZ)";
                }
            }

            if (problem is not null)
            {
                problems.Add(new($"{console.Path}:{key}", $"'{value}' {problem}"));
            }
        }
    }

    /// <summary>Why .NET cannot bind value at option (a path under type), or null where it can.</summary>
    private static string? ConsoleOptionProblem(Type type, string option, string value)
    {
        var one = new ConfigurationBuilder().AddInMemoryCollection([new(option, value)]).Build();
        try
        {
            one.Bind(Activator.CreateInstance(type)!);
            return null;
        }
        catch (InvalidOperationException)
        {
            // Not convertible to the option's type: say what it takes.
            var target = option.Split(':').Aggregate((Type?)type, (t, name) => t?.GetProperty(name, BindingFlags.Public | BindingFlags.Instance | BindingFlags.IgnoreCase)?.PropertyType);
            target = target is null ? null : Nullable.GetUnderlyingType(target) ?? target;
            return target switch
            {
                not null when target == typeof(bool) => "is not true or false",
                not null when target == typeof(int) => "is not a whole number",
                { IsEnum: true } => $"is not one of {string.Join(", ", Enum.GetNames(target))}",
                _ => $"cannot be read as {target?.Name ?? "this option"}",
            };
        }
        catch (Exception ex) when (ex is ArgumentException or TargetInvocationException)
        {
            // Converted, and refused by the option itself.
            return $"is out of range ({(ex is TargetInvocationException { InnerException: { } inner } ? inner : ex).Message})";
        }
    }

    private static byte[] LoadTicketKeys(string? path, List<ConfigurationProblem> problems)
    {
        const string key = "Tern:Tls:SessionTicketKeys";
        if (path is null)
        {
            return [];
        }

        try
        {
            var keys = TernFile.ReadAllBytes(path);
            if (keys.Length == 0 || keys.Length % SessionTicketKeySize != 0)
            {
                problems.Add(new(key, $"'{path}' holds {keys.Length} bytes; it must hold one or more {SessionTicketKeySize}-byte keys (e.g. `openssl rand 80 > ticket.key`), the first one encrypting new tickets"));
                return [];
            }

            return keys;
        }
        catch (Exception ex) when (ex is IOException or UnauthorizedAccessException)
        {
            problems.Add(new(key, $"cannot read '{path}': {ex.Message}"));
            return [];
        }
    }

    private static CertificateSet? LoadCertificates(TernSettings settings, bool selfSigned, List<ConfigurationProblem> problems)
    {
        if (!selfSigned)
        {
            return CertificateSet.Load(settings.Certificates, problems);
        }

        try
        {
            return CertificateSet.Load([SelfSignedCertificate.Ensure(settings.SelfSignedDirectory)], problems);
        }
        catch (Exception ex) when (ex is IOException or UnauthorizedAccessException or ArgumentException)
        {
            problems.Add(new("Tern:Tls:SelfSignedDirectory",
                $"no certificate is configured and the self-signed one cannot be written to '{settings.SelfSignedDirectory}': {ex.Message}; configure Tern:Tls:Certificates or point this at a writable folder"));
            return null;
        }
    }
}
