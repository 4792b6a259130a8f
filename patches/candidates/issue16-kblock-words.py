#!/usr/bin/env python3
"""The whole-block K reads of 0100/0101 (session n's EXP_K_BLOCK) re-done in Python: a turbo K block read as 32-bit words from the 4-byte boundary
before it gives the same norm and index words per 16-value chunk as turbo_load_raw16, for turbo2/3/4 at head sizes 128, 256 and 512,
every thread and chunk of a row, and reads nothing past the row; and two q8_0 blocks read as 17 words give their scales and
quants (q8_0 K of the TurboQuant V kernels, head sizes 64-512; 0101 uses it from 256). Checks the arithmetic, not the CUDA build."""
import random, struct
M=0xFFFFFFFF
def fsr(lo,hi,s): return ((hi<<32|lo)>>s)&M            # __funnelshift_r with s<32
def fsrc(lo,hi,s): return ((hi<<32|lo)>>min(s,32))&M   # __funnelshift_rc
for bits in (2,3,4):
  for nthreads in (2,4,8):  # head sizes 128, 256, 512
    bs=2+64*bits//8; nq=1 if bits==2 else 2
    for trial in range(200):
        pre=random.choice([0,4,8,12,16])                  # row starts 4-byte aligned within the buffer
        buf=bytes(random.randrange(256) for _ in range(pre+nthreads*bs))
        row=pre
        for t in range(nthreads):
            # reference: chunk c of block t = values 64t+16c, via turbo_load_raw16
            ref=[]
            for c in range(4):
                i0=64*t+16*c; x=row+(i0//64)*bs; qs=x+2+2*bits*((i0%64)//16)
                d=struct.unpack_from('<H',buf,x)[0]
                u=list(struct.unpack_from('<%dH'%bits,buf,qs))+[0]*(2*nq-bits)
                q=[u[2*k]|(u[2*k+1]<<16) for k in range(nq)]
                ref.append((d,q))
            # block version
            off=t*bs; base=row+(off&~3); sh=(off&3)*8
            nw=2*bits+1
            assert base+4*nw<=len(buf), (bits,t,'over-read')
            w=list(struct.unpack_from('<%dI'%nw,buf,base))
            d=fsrc(w[0],w[1],sh)&0xFFFF
            y=[fsrc(w[j],w[j+1],sh+16) for j in range(2*bits)]
            for c in range(4):
                o=2*bits*c
                q=[y[o//4] if o%4==0 else fsr(y[o//4],y[o//4+1],16)]
                if bits==3: q.append((y[o//4+1]&0xFFFF) if o%4==0 else (y[o//4+1]>>16))
                if bits==4: q.append(y[o//4+1])
                assert (d,q)==ref[c], (bits,t,c,(d,q),ref[c])
# q8_0 K (turbo V kernels): two blocks of 34 bytes per thread, 68 bytes from a 4-byte boundary, as 17 words
for nthreads in (1,2,4,8):  # head sizes 64-512
    for trial in range(200):
        pre=random.choice([0,4,8,12,16])
        buf=bytes(random.randrange(256) for _ in range(pre+nthreads*68))
        for t in range(nthreads):
            w=list(struct.unpack_from('<17I',buf,pre+68*t))
            for b in range(2):
                x=pre+68*t+34*b                                   # reference: block_q8_0 {d, qs[32]}
                d=struct.unpack_from('<H',buf,x)[0]; qs=list(struct.unpack_from('<8I',buf,x+2))
                d2=w[0]&0xFFFF if b==0 else w[8]>>16
                qs2=[fsr(w[j],w[j+1],16) if b==0 else w[9+j] for j in range(8)]
                assert (d2,qs2)==(d,qs), ('q8_0',nthreads,t,b)
print("ok: block words == per-chunk loads for turbo2/3/4 at D=128/256/512 and q8_0 at D=64-512, every thread and chunk; no read past the row")
