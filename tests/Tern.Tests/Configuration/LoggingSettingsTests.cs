using Microsoft.Extensions.Configuration;
using Tern.Proxy.Configuration;
using Tern.Tests.Infrastructure;

namespace Tern.Tests.Configuration;

/// <summary>
/// The Logging section as .NET's logging reads it: each value it cannot use is a problem of its
/// key (checked at start and on every reload, before the logging system gets it); what it takes,
/// Tern takes.
/// </summary>
public sealed class LoggingSettingsTests
{
    [Theory]
    [InlineData("Logging:Console:FormatterOptions:IncludeScopes", "false", null)]
    [InlineData("Logging:Console:FormatterOptions:IncludeScopes", "", null)] // .NET leaves an empty value alone (Helm's value: "")
    [InlineData("Logging:Console:MaxQueueLength", "", null)]
    [InlineData("Logging:Console:maxqueuelength", "5000", null)] // any case
    [InlineData("Logging:Console:FormatterName", "Json", null)]
    [InlineData("Logging:Console:FormatterOptions:JsonWriterOptions:Indented", "true", null)]
    [InlineData("Logging:Console:FormatterOptions:TimestampFormat", "HH:mm:ss ", null)]
    [InlineData("Logging:Console:MaxQueueLength", "0x10", "'0x10' is not a whole number")] // the binder would take hex; .NET's console logger throws
    [InlineData("Logging:Console:MaxQueueLength", "0", "'0' is out of range (")]
    [InlineData("Logging:Console:FormatterOptions:JsonWriterOptions:Indented", "yes", "'yes' is not true or false")]
    [InlineData("Logging:Microsoft.Extensions.Logging.Console.ConsoleLoggerProvider:QueueFullMode", "Drop", "'Drop' is not one of Wait, DropWrite")] // the provider's full name reads the same options
    [InlineData("Logging:Console:FormatterName", "xml", "'xml' is not a console log format; use simple, json or systemd")]
    [InlineData("Logging:Console:FormatterOptions:TimestampFormat", "%", "'%' is not a .NET date and time format")]
    [InlineData("Logging:LogLevel", "Warning", "'Warning' is given to the section itself, which .NET ignores; name a category: Logging:LogLevel:Default=Warning")]
    public void ConsoleValue_AProblemOfItsKey_OnlyWhereDotNetCannotUseIt(string key, string value, string? problem)
    {
        var values = new Dictionary<string, string?>
        {
            ["Tern:Tls:Certificates:a:CertificatePath"] = TestPki.ATest.CertificatePath,
            ["Tern:Tls:Certificates:a:KeyPath"] = TestPki.ATest.KeyPath,
            [key] = value,
        };

        ConfigurationSnapshot.TryLoad(new ConfigurationBuilder().AddInMemoryCollection(values).Build(), out var problems);

        if (problem is null)
        {
            Assert.Empty(problems);
        }
        else
        {
            var found = Assert.Single(problems);
            Assert.Equal(key, found.Key, ignoreCase: true);
            Assert.StartsWith(problem, found.Message, StringComparison.Ordinal);
        }
    }
}
