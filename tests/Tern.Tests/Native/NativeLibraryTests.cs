using Tern.Tests.Infrastructure;

namespace Tern.Tests.Native;

public sealed class NativeLibraryTests
{
    /// <summary>
    /// src/Native's own C tests, built with AddressSanitizer and UndefinedBehaviorSanitizer
    /// (any report aborts the run), so that `dotnet test` covers the native code too.
    /// </summary>
    [Fact]
    public async Task CTests_UnderAddressAndUndefinedBehaviorSanitizers_Pass()
    {
        var source = Path.Combine(Repository.Root, "src", "Native");
        var build = Path.Combine(Repository.Root, "artifacts", "native", "sanitize");

        var configure = await Tool.RunAsync("cmake", ["-S", source, "-B", build, "-DTERN_SANITIZE=ON", "-DBUILD_TESTING=ON", "-DCMAKE_BUILD_TYPE=Debug"], timeoutSeconds: 120);
        Assert.True(configure.ExitCode == 0, configure.Output);
        var compile = await Tool.RunAsync("cmake", ["--build", build], timeoutSeconds: 300);
        Assert.True(compile.ExitCode == 0, compile.Output);
        var test = await Tool.RunAsync("ctest", ["--test-dir", build, "--output-on-failure"], timeoutSeconds: 300);

        Assert.True(test.ExitCode == 0, test.Output);
        Assert.Contains("100% tests passed", test.Output, StringComparison.Ordinal);
    }

    [Fact]
    public void Build_CopiesLibraryNextToProxy() =>
        Assert.True(File.Exists(Path.Combine(AppContext.BaseDirectory, "libtern_tls.so")));
}
